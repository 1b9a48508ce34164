#include "quant/json_fields.h"

#include <fmt/format.h>

#include "base/error.h"

namespace serval::quant {

nlohmann::json parse_json_text(std::string_view text, const std::string& path) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw LoadError(fmt::format("{}: invalid JSON: {}", path, e.what()));
  }
}

JsonFields::JsonFields(const nlohmann::json& obj, const std::string& path, std::string prefix)
    : obj_(obj), path_(path), prefix_(std::move(prefix)) {
  if (!obj_.is_object()) {
    std::string where = prefix_.empty() ? "the top level" : "key '" + prefix_ + "'";
    if (!prefix_.empty()) where.erase(where.size() - 2, 1);  // drop the trailing '.'
    throw LoadError(fmt::format("{}: {} must be a JSON object", path_, where));
  }
}

const nlohmann::json* JsonFields::find(std::string_view key) const {
  auto it = obj_.find(std::string(key));
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

void JsonFields::fail(std::string_view key, const std::string& msg) const {
  throw LoadError(fmt::format("{}: key '{}': {}", path_, key_path(key), msg));
}

std::string JsonFields::str(std::string_view key) const {
  const nlohmann::json* v = find(key);
  if (!v) fail(key, "missing");
  if (!v->is_string()) fail(key, "must be a string, got " + v->dump());
  return v->get<std::string>();
}

std::string JsonFields::str_or(std::string_view key, std::string fallback) const {
  return has(key) ? str(key) : fallback;
}

int JsonFields::int_or(std::string_view key, int fallback) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_number_integer() || v->get<int64_t>() < -(int64_t(1) << 30) ||
      v->get<int64_t>() > (int64_t(1) << 30))
    fail(key, "must be an integer (|x| <= 2^30), got " + v->dump());
  return v->get<int>();
}

bool JsonFields::bool_or(std::string_view key, bool fallback) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(key, "must be true or false, got " + v->dump());
  return v->get<bool>();
}

std::vector<std::string> JsonFields::strings(std::string_view key) const {
  const nlohmann::json* v = find(key);
  if (!v) return {};
  if (!v->is_array()) fail(key, "must be a list of strings, got " + v->dump());
  std::vector<std::string> out;
  for (const nlohmann::json& e : *v) {
    if (!e.is_string()) fail(key, "must be a list of strings, has element " + e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::array<int, 2> JsonFields::int_pair(std::string_view key) const {
  const nlohmann::json* v = find(key);
  if (!v) fail(key, "missing");
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number_integer() ||
      !(*v)[1].is_number_integer() || (*v)[0].get<int64_t>() <= 0 || (*v)[1].get<int64_t>() <= 0 ||
      (*v)[0].get<int64_t>() > (1 << 20) || (*v)[1].get<int64_t>() > (1 << 20))
    fail(key, "must be a list of two positive integers, got " + v->dump());
  return {(*v)[0].get<int>(), (*v)[1].get<int>()};
}

JsonFields JsonFields::object(std::string_view key) const {
  const nlohmann::json* v = find(key);
  if (!v) fail(key, "missing");
  if (!v->is_object()) fail(key, "must be a JSON object, got " + v->dump());
  return JsonFields(*v, path_, key_path(key) + ".");
}

}  // namespace serval::quant
