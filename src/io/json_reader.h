// Typed, error-reporting access to the JSON files of a model folder (config.json, index files).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace serval::io {

// Reads a whole file; LoadError naming `path` if it cannot be opened or read.
std::string read_text_file(const std::string& path);

// Parses JSON text; LoadError naming `path` and the byte offset on a syntax error.
nlohmann::json parse_json(std::string_view text, const std::string& path);

// Reads keys of one JSON object. Every error is a LoadError "<path>: key '<prefix><key>' ...".
// A key whose value is null counts as absent (Hugging Face writes `"rope_scaling": null`).
class JsonReader {
 public:
  // `obj` must outlive the reader. `prefix` names the enclosing object ("rope_scaling.").
  JsonReader(const nlohmann::json& obj, const std::string& path, std::string prefix = "");

  bool has(std::string_view key) const;
  const nlohmann::json* find(std::string_view key) const;  // nullptr if absent or null

  // Required keys: LoadError "missing required key" when absent.
  int64_t get_int(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  double get_number(std::string_view key) const;

  // Optional keys: nullopt when absent or null; LoadError on a wrong type.
  std::optional<int64_t> opt_int(std::string_view key) const;
  std::optional<double> opt_number(std::string_view key) const;
  std::optional<bool> opt_bool(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key) const;

  // Converts an integer value of `key` (already looked up) with a range check.
  int64_t as_int(const nlohmann::json& v, std::string_view key) const;
  // Throws LoadError "<path>: key '<prefix><key>' <what>".
  [[noreturn]] void fail(std::string_view key, std::string_view what) const;

  const std::string& path() const { return path_; }

 private:
  const nlohmann::json& obj_;
  std::string path_;
  std::string prefix_;
};

// Name of a JSON value's type for error messages ("string", "array", ...).
std::string_view json_type_name(const nlohmann::json& v);

}  // namespace serval::io
