#include "io/json_reader.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace serval::io {

using nlohmann::json;

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw LoadError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw LoadError(fmt::format("{}: read error", path));
  return ss.str();
}

json parse_json(std::string_view text, const std::string& path) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw LoadError(fmt::format("{}: invalid JSON at byte {}: {}", path, e.byte, e.what()));
  } catch (const json::exception& e) {  // e.g. out_of_range for a number like 1e999
    throw LoadError(fmt::format("{}: invalid JSON: {}", path, e.what()));
  }
}

std::string_view json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "object";
    case json::value_t::array:
      return "array";
    case json::value_t::string:
      return "string";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::binary:
      return "binary";
    case json::value_t::discarded:
      return "discarded";
  }
  return "?";
}

JsonReader::JsonReader(const json& obj, const std::string& path, std::string prefix)
    : obj_(obj), path_(path), prefix_(std::move(prefix)) {
  if (!obj_.is_object()) {
    throw LoadError(fmt::format("{}: {} must be a JSON object, got {}", path_,
                                prefix_.empty() ? "the top level" : "'" + prefix_ + "'",
                                json_type_name(obj_)));
  }
}

void JsonReader::fail(std::string_view key, std::string_view what) const {
  throw LoadError(fmt::format("{}: key '{}{}' {}", path_, prefix_, key, what));
}

const json* JsonReader::find(std::string_view key) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonReader::has(std::string_view key) const {
  return find(key) != nullptr;
}

int64_t JsonReader::as_int(const json& v, std::string_view key) const {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) fail(key, fmt::format("is out of range ({})", u));
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    // Some writers emit 4096.0 for an integer; accept it only if it is exactly integral.
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.0e15) return int64_t(d);
    fail(key, fmt::format("must be an integer, got {}", d));
  }
  fail(key, fmt::format("must be an integer, got {}", json_type_name(v)));
}

int64_t JsonReader::get_int(std::string_view key) const {
  auto v = opt_int(key);
  if (!v) fail(key, "is missing (required)");
  return *v;
}

std::string JsonReader::get_string(std::string_view key) const {
  auto v = opt_string(key);
  if (!v) fail(key, "is missing (required)");
  return *v;
}

double JsonReader::get_number(std::string_view key) const {
  auto v = opt_number(key);
  if (!v) fail(key, "is missing (required)");
  return *v;
}

std::optional<int64_t> JsonReader::opt_int(std::string_view key) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  return as_int(*v, key);
}

std::optional<double> JsonReader::opt_number(std::string_view key) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) fail(key, fmt::format("must be a number, got {}", json_type_name(*v)));
  return v->get<double>();
}

std::optional<bool> JsonReader::opt_bool(std::string_view key) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) fail(key, fmt::format("must be a boolean, got {}", json_type_name(*v)));
  return v->get<bool>();
}

std::optional<std::string> JsonReader::opt_string(std::string_view key) const {
  const json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) fail(key, fmt::format("must be a string, got {}", json_type_name(*v)));
  return v->get<std::string>();
}

}  // namespace serval::io
