// Post-processors: only the single-sequence template matters for serving.
#include "tokenizer/post_processor.h"

#include <fmt/format.h>

#include "base/error.h"

namespace serval::tokenizer {
namespace {

void add_wrap(const nlohmann::json& c,
              const std::function<std::optional<int32_t>(std::string_view)>& lookup,
              SpecialWrap& wrap) {
  if (c.is_null()) return;
  const std::string type = c.at("type").get<std::string>();
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& sub : c.at("processors")) add_wrap(sub, lookup, wrap);
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    wrap.before.push_back(c.at("cls").at(1).get<int32_t>());
    wrap.after.insert(wrap.after.begin(), c.at("sep").at(1).get<int32_t>());
    return;
  }
  if (type != "TemplateProcessing")
    throw LoadError(fmt::format("tokenizer.json: unsupported post_processor type '{}'", type));
  const auto specials = c.value("special_tokens", nlohmann::json::object());
  bool seen_sequence = false;
  std::vector<int32_t> before, after;
  for (const auto& item : c.at("single")) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    std::vector<int32_t> ids;
    if (auto it = specials.find(name); it != specials.end()) {
      ids = it->at("ids").get<std::vector<int32_t>>();
    } else if (auto id = lookup(name)) {
      ids.push_back(*id);
    } else {
      throw LoadError(
          fmt::format("tokenizer.json: TemplateProcessing names unknown token '{}'", name));
    }
    auto& dst = seen_sequence ? after : before;
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  // A later processor in a Sequence wraps the output of the earlier ones.
  wrap.before.insert(wrap.before.begin(), before.begin(), before.end());
  wrap.after.insert(wrap.after.end(), after.begin(), after.end());
}

}  // namespace

SpecialWrap make_special_wrap(
    const nlohmann::json& config,
    const std::function<std::optional<int32_t>(std::string_view)>& lookup) {
  SpecialWrap wrap;
  add_wrap(config, lookup, wrap);
  return wrap;
}

}  // namespace serval::tokenizer
