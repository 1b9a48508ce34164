// Reasoning text in chat outputs, for `serve --reasoning-parser {deepseek_r1,deepseek_v3,mistral,
// qwen3}`: what
// a thinking model writes in its reasoning block goes to the message's `reasoning` (and
// `reasoning_content`, vLLM's earlier name for it), the rest to `content`.
//
// deepseek_r1 and qwen3 (the block ends at "</think>"):
// - A "<think>" at the very start of the output is dropped: older templates let the model open
//   the block itself, newer ones put it at the end of the prompt.
// - Text before the first "</think>" is reasoning, text after it content (either may be empty).
// - Without "</think>" the whole output is reasoning (a reply cut short while thinking), except
//   for qwen3 with chat_template_kwargs {"enable_thinking": false}: the template then closes the
//   block in the prompt and the whole output is content.
// deepseek_v3 (DeepSeek-V3.1, whose template thinks only when asked): deepseek_r1's reading when
//   chat_template_kwargs has "thinking" (or "enable_thinking") true, else the whole output is
//   content, as vLLM reads it.
// mistral (Magistral: the special tokens "[THINK]" and "[/THINK]", kept in the output for it):
// - A reply starts outside the block; text between the first "[THINK]" and the "[/THINK]" after
//   it is reasoning, the text before and after the block content. A reply cut short after
//   "[THINK]" has all of its rest as reasoning; one without "[THINK]" is all content, its first
//   "[/THINK]" (a close without an open) dropped, as vLLM reads it.
// A stream sends, at every point, a prefix of what the finished text splits into, so the deltas
// add up to the non-streamed message.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace serval::server {

enum class ReasoningParser { kNone, kDeepSeekR1, kDeepSeekV3, kMistral, kQwen3 };

// `--reasoning-parser` value → parser; nullopt for an unknown name.
std::optional<ReasoningParser> reasoning_parser_from_name(std::string_view name);
inline constexpr std::string_view kReasoningParserChoices =
    "deepseek_r1, deepseek_v3, mistral, qwen3";

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";
inline constexpr std::string_view kMistralThinkOpen = "[THINK]";
inline constexpr std::string_view kMistralThinkClose = "[/THINK]";

// Whether the parser's markers are special tokens, which the output must then keep
// (skip_special_tokens false).
bool reasoning_markers_are_special(ReasoningParser parser);

// Whether a reply starts inside the reasoning block: deepseek_r1; qwen3 unless the request turned
// thinking off; deepseek_v3 when it turned thinking on (`enable_thinking`, `thinking`:
// chat_template_kwargs' values, if given).
bool starts_in_reasoning(ReasoningParser parser, std::optional<bool> enable_thinking,
                         std::optional<bool> thinking = std::nullopt);

struct ReasoningParts {
  std::string reasoning;
  std::string content;
};

// The reasoning and content of `text` (the output so far) under `parser` (not kNone);
// `in_reasoning` is starts_in_reasoning's answer. Unless `finished`, a tail that may still become
// a marker is in neither part.
ReasoningParts split_reasoning(ReasoningParser parser, std::string_view text, bool in_reasoning,
                               bool finished);

}  // namespace serval::server
