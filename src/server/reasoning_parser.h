// Reasoning text in chat outputs, for `serve --reasoning-parser {deepseek_r1,qwen3}`: what a
// thinking model writes before </think> goes to the message's `reasoning` (and
// `reasoning_content`, vLLM's earlier name for it), the rest to `content`.
//
// The rules (both parsers; they differ only in when a reply starts outside the reasoning):
// - A "<think>" at the very start of the output is dropped: older templates let the model open
//   the block itself, newer ones put it at the end of the prompt.
// - Text before the first "</think>" is reasoning, text after it content (either may be empty).
// - Without "</think>" the whole output is reasoning (a reply cut short while thinking), except
//   for qwen3 with chat_template_kwargs {"enable_thinking": false}: the template then closes the
//   block in the prompt and the whole output is content.
// A stream sends, at every point, a prefix of what the finished text splits into, so the deltas
// add up to the non-streamed message.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace serval::server {

enum class ReasoningParser { kNone, kDeepSeekR1, kQwen3 };

// `--reasoning-parser` value → parser; nullopt for an unknown name.
std::optional<ReasoningParser> reasoning_parser_from_name(std::string_view name);
inline constexpr std::string_view kReasoningParserChoices = "deepseek_r1, qwen3";

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

// Whether a reply starts inside the reasoning block: every parser but qwen3 with thinking turned
// off by the request (`enable_thinking`: chat_template_kwargs' value, if given).
bool starts_in_reasoning(ReasoningParser parser, std::optional<bool> enable_thinking);

struct ReasoningParts {
  std::string_view reasoning;  // views into the text given
  std::string_view content;
};

// The reasoning and content of `text` (the output so far). Unless `finished`, a tail that may
// still become "<think>" (at the start) or "</think>" is in neither part.
ReasoningParts split_reasoning(std::string_view text, bool in_reasoning, bool finished);

}  // namespace serval::server
