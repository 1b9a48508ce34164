// Typed access to the keys of one JSON object of a quantization description; every error names
// the file and the full key path. Internal to src/quant/.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::quant {

// Parses `text`; LoadError "<path>: invalid JSON: ..." when malformed.
nlohmann::json parse_json_text(std::string_view text, const std::string& path);

class JsonFields {
 public:
  // `obj` must outlive this; `prefix` is the key path of `obj` ("" for the root,
  // "quantization_config." for a nested object), used in messages.
  JsonFields(const nlohmann::json& obj, const std::string& path, std::string prefix);

  const nlohmann::json* find(std::string_view key) const;  // nullptr if absent or null
  bool has(std::string_view key) const { return find(key) != nullptr; }
  std::string str(std::string_view key) const;  // required string
  std::string str_or(std::string_view key, std::string fallback) const;
  int int_or(std::string_view key, int fallback) const;
  bool bool_or(std::string_view key, bool fallback) const;
  std::vector<std::string> strings(std::string_view key) const;  // absent -> empty
  std::array<int, 2> int_pair(std::string_view key) const;       // required [a, b], a, b > 0
  JsonFields object(std::string_view key) const;                 // required object
  const nlohmann::json& json() const { return obj_; }
  const std::string& path() const { return path_; }
  std::string key_path(std::string_view key) const { return prefix_ + std::string(key); }
  // LoadError "<path>: key '<prefix><key>': <msg>".
  [[noreturn]] void fail(std::string_view key, const std::string& msg) const;

 private:
  const nlohmann::json& obj_;
  std::string path_, prefix_;
};

}  // namespace serval::quant
