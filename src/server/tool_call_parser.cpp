#include "server/tool_call_parser.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "server/marker_tail.h"

namespace serval::server {

namespace {

constexpr std::string_view kToolCallClose = "</tool_call>";

// One call's body, or nullopt when it is not a call.
std::optional<ToolCall> parse_call(std::string_view body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  ToolCall call{name->get<std::string>(), "{}"};
  if (auto args = j.find("arguments"); args != j.end()) {
    if (args->is_string())
      call.arguments = args->get<std::string>();
    else if (args->is_object())
      call.arguments = args->dump();
    else
      return std::nullopt;
  }
  return call;
}

}  // namespace

ParsedToolCalls parse_hermes_tool_calls(std::string_view text) {
  ParsedToolCalls out;
  const size_t first = text.find(kToolCallOpen);
  if (first == std::string_view::npos) {
    out.content = std::string(text);
    return out;
  }
  size_t at = first;
  while (at != std::string_view::npos) {
    const size_t body = at + kToolCallOpen.size();
    const size_t close = text.find(kToolCallClose, body);
    const std::string_view inner =
        text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
    std::optional<ToolCall> call = parse_call(inner);
    if (!call) return {std::string(text), {}};
    out.calls.push_back(std::move(*call));
    if (close == std::string_view::npos) break;
    at = text.find(kToolCallOpen, close + kToolCallClose.size());
  }
  out.content = std::string(text.substr(0, first));
  return out;
}

std::vector<ToolCall> parse_tool_call_list(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array() || j.empty()) return {};
  std::vector<ToolCall> calls;
  for (const nlohmann::json& c : j) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
        !c.contains("parameters"))
      return {};
    calls.push_back({c["name"].get<std::string>(), c["parameters"].dump()});
  }
  return calls;
}

size_t hermes_content_prefix(std::string_view text) {
  const size_t open = text.find(kToolCallOpen);
  if (open != std::string_view::npos) return open;
  return text.size() - partial_marker_tail(text, kToolCallOpen);
}

}  // namespace serval::server
