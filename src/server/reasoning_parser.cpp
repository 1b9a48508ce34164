#include "server/reasoning_parser.h"

#include "server/marker_tail.h"

namespace serval::server {

std::optional<ReasoningParser> reasoning_parser_from_name(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningParser::kDeepSeekR1;
  if (name == "qwen3") return ReasoningParser::kQwen3;
  return std::nullopt;
}

bool starts_in_reasoning(ReasoningParser parser, std::optional<bool> enable_thinking) {
  if (parser == ReasoningParser::kNone) return false;
  return !(parser == ReasoningParser::kQwen3 && enable_thinking == false);
}

ReasoningParts split_reasoning(std::string_view text, bool in_reasoning, bool finished) {
  if (!in_reasoning) return {{}, text};
  if (!finished && text.size() < kThinkOpen.size() && kThinkOpen.starts_with(text))
    return {};  // may still become the opening tag
  std::string_view body = text;
  if (body.starts_with(kThinkOpen)) body.remove_prefix(kThinkOpen.size());
  if (const size_t close = body.find(kThinkClose); close != std::string_view::npos)
    return {body.substr(0, close), body.substr(close + kThinkClose.size())};
  if (!finished) body.remove_suffix(partial_marker_tail(body, kThinkClose));
  return {body, {}};
}

}  // namespace serval::server
