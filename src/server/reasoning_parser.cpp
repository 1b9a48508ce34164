#include "server/reasoning_parser.h"

#include <algorithm>

#include "server/marker_tail.h"

namespace serval::server {
namespace {

// deepseek_r1, deepseek_v3 and qwen3: "<think>" optional at the start, the block closed by
// "</think>".
ReasoningParts split_think_tags(std::string_view text, bool in_reasoning, bool finished) {
  if (!in_reasoning) return {{}, std::string(text)};
  if (!finished && text.size() < kThinkOpen.size() && kThinkOpen.starts_with(text))
    return {};  // may still become the opening tag
  std::string_view body = text;
  if (body.starts_with(kThinkOpen)) body.remove_prefix(kThinkOpen.size());
  if (const size_t close = body.find(kThinkClose); close != std::string_view::npos)
    return {std::string(body.substr(0, close)),
            std::string(body.substr(close + kThinkClose.size()))};
  if (!finished) body.remove_suffix(partial_marker_tail(body, kThinkClose));
  return {std::string(body), {}};
}

// `text` without the first occurrence of `marker`.
std::string without_first(std::string_view text, std::string_view marker) {
  const size_t at = text.find(marker);
  if (at == std::string_view::npos) return std::string(text);
  return std::string(text.substr(0, at)).append(text.substr(at + marker.size()));
}

// mistral: content, then an optional [THINK] … [/THINK] block, then content.
ReasoningParts split_think_brackets(std::string_view text, bool finished) {
  const size_t open = text.find(kMistralThinkOpen);
  std::string_view before = text.substr(0, open);  // all of it when there is no open
  if (open == std::string_view::npos && !finished)
    before.remove_suffix(std::max(partial_marker_tail(before, kMistralThinkOpen),
                                  partial_marker_tail(before, kMistralThinkClose)));
  ReasoningParts parts{{}, without_first(before, kMistralThinkClose)};
  if (open == std::string_view::npos) return parts;
  std::string_view block = text.substr(open + kMistralThinkOpen.size());
  if (const size_t close = block.find(kMistralThinkClose); close != std::string_view::npos) {
    parts.reasoning = block.substr(0, close);
    parts.content.append(block.substr(close + kMistralThinkClose.size()));
    return parts;
  }
  if (!finished) block.remove_suffix(partial_marker_tail(block, kMistralThinkClose));
  parts.reasoning = block;
  return parts;
}

}  // namespace

std::optional<ReasoningParser> reasoning_parser_from_name(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningParser::kDeepSeekR1;
  if (name == "deepseek_v3") return ReasoningParser::kDeepSeekV3;
  if (name == "mistral") return ReasoningParser::kMistral;
  if (name == "qwen3") return ReasoningParser::kQwen3;
  return std::nullopt;
}

bool reasoning_markers_are_special(ReasoningParser parser) {
  return parser == ReasoningParser::kMistral;
}

bool starts_in_reasoning(ReasoningParser parser, std::optional<bool> enable_thinking,
                         std::optional<bool> thinking) {
  switch (parser) {
    case ReasoningParser::kNone:
    case ReasoningParser::kMistral:
      return false;
    case ReasoningParser::kQwen3:
      return enable_thinking != false;
    case ReasoningParser::kDeepSeekR1:
      return true;
    case ReasoningParser::kDeepSeekV3:
      return enable_thinking == true || thinking == true;
  }
  return false;
}

ReasoningParts split_reasoning(ReasoningParser parser, std::string_view text, bool in_reasoning,
                               bool finished) {
  if (parser == ReasoningParser::kMistral) return split_think_brackets(text, finished);
  return split_think_tags(text, in_reasoning, finished);
}

}  // namespace serval::server
