#include "quant/quant_config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "base/error.h"
#include "quant/config_parsers.h"

namespace serval::quant {
namespace {

using Method = QuantConfig::Method;

std::string upper(std::string s) {
  for (char& ch : s) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// Compiled regexes shared by all callers: is_quantized runs once per linear module (tens of
// thousands for a large MoE) and compiling a std::regex each time would dominate load time.
const std::regex& compiled(const std::string& pattern) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::regex> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(pattern);
  if (it == cache.end()) {
    try {
      it = cache.emplace(pattern, std::regex(pattern, std::regex::ECMAScript)).first;
    } catch (const std::regex_error& e) {
      throw InvalidArgument(fmt::format("invalid regular expression '{}': {}", pattern, e.what()));
    }
  }
  return it->second;
}

// Matches one "[...]" set at pattern[pi] against ch. Returns false with *end = npos when the
// set has no closing ']' (then fnmatch treats '[' literally).
bool match_set(std::string_view pattern, size_t pi, char ch, size_t* end) {
  size_t i = pi + 1;
  bool negate = i < pattern.size() && pattern[i] == '!';
  if (negate) ++i;
  size_t first = i;
  bool hit = false;
  for (; i < pattern.size(); ++i) {
    if (pattern[i] == ']' && i > first) break;  // a ']' right after '[' or '[!' is literal
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      if (pattern[i] <= ch && ch <= pattern[i + 2]) hit = true;
      i += 2;
    } else if (pattern[i] == ch) {
      hit = true;
    }
  }
  if (i >= pattern.size()) {
    *end = std::string_view::npos;
    return false;
  }
  *end = i + 1;
  return hit != negate;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw LoadError(fmt::format("{}: cannot open", p.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string_view method_name(Method m) {
  switch (m) {
    case Method::kNone:
      return "none";
    case Method::kNvfp4:
      return "nvfp4";
    case Method::kFp8PerTensor:
      return "fp8-per-tensor";
    case Method::kFp8PerChannel:
      return "fp8-per-channel";
    case Method::kFp8Block:
      return "fp8-block";
  }
  return "?";
}

std::string describe(const QuantConfig& c) {
  std::string s(method_name(c.method));
  if (c.method == Method::kNvfp4) s += fmt::format(" (group {})", c.group_size);
  if (c.method == Method::kFp8Block) s += fmt::format(" ({}x{})", c.block_size[0], c.block_size[1]);
  if (c.method != Method::kNone)
    s += c.weight_only ? ", weight-only" : c.static_activations ? ", static act" : ", dynamic act";
  if (c.kv_cache_fp8) s += ", kv fp8";
  size_t excluded = c.exclude_names.size() + c.exclude_globs.size() + c.exclude_regexes.size();
  if (excluded) s += fmt::format(", {} exclude entries", excluded);
  if (!c.source.empty()) s += " from " + c.source;
  return s;
}

void validate_regex(const JsonFields& fields, std::string_view key, const std::string& pattern) {
  try {
    compiled(pattern);
  } catch (const InvalidArgument& e) {
    fields.fail(key, e.what());
  }
}

QuantConfig parse_modelopt(const JsonFields& q) {
  QuantConfig c;
  c.source = q.path();
  c.vllm_name = "modelopt";
  std::string algo = upper(q.str_or("quant_algo", "NONE"));
  if (algo == "NVFP4") {
    c.method = Method::kNvfp4;
    c.group_size = q.int_or("group_size", 16);
    if (c.group_size != 16)
      q.fail("group_size", fmt::format("NVFP4 needs 16, got {}", c.group_size));
    c.static_activations = true;  // input_scale per linear
    c.vllm_name = "modelopt_fp4";
  } else if (algo == "FP8") {
    c.method = Method::kFp8PerTensor;
    c.static_activations = true;
  } else if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    c.method = Method::kFp8PerChannel;
  } else if (algo == "FP8_PB_WO") {
    c.method = Method::kFp8Block;
    c.block_size = {128, 128};
    c.weight_only = true;
    c.block_scale_name = "weight_scale";
  } else if (algo != "NONE") {
    q.fail("quant_algo", fmt::format("unsupported algorithm \"{}\" (serval supports NVFP4, FP8, "
                                     "FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO)",
                                     q.str("quant_algo")));
  }
  std::string kv = upper(q.str_or("kv_cache_quant_algo", "NONE"));
  if (kv == "FP8") {
    c.kv_cache_fp8 = true;
  } else if (kv != "NONE") {
    q.fail("kv_cache_quant_algo",
           fmt::format("unsupported KV-cache algorithm \"{}\" (serval supports FP8 or null)",
                       q.str("kv_cache_quant_algo")));
  }
  // config.json exports of newer ModelOpt versions call the list "ignore".
  c.exclude_globs = q.has("exclude_modules") ? q.strings("exclude_modules") : q.strings("ignore");
  return c;
}

QuantConfig parse_fp8_method(const JsonFields& q) {
  QuantConfig c;
  c.source = q.path();
  c.vllm_name = "fp8";
  if (q.has("weight_block_size")) {
    c.method = Method::kFp8Block;
    c.block_size = q.int_pair("weight_block_size");
    c.block_scale_name = "weight_scale_inv";
  } else {
    c.method = Method::kFp8PerTensor;
  }
  std::string act = q.str_or("activation_scheme", "dynamic");
  if (act == "static") {
    if (c.method == Method::kFp8Block)
      q.fail("activation_scheme", "block-wise FP8 supports only \"dynamic\" activations");
    c.static_activations = true;
  } else if (act != "dynamic") {
    q.fail("activation_scheme",
           fmt::format("unknown value \"{}\" (expected \"dynamic\" or \"static\")", act));
  }
  // Hugging Face's FineGrainedFP8Config calls the list modules_to_not_convert.
  c.exclude_names =
      q.has("ignored_layers") ? q.strings("ignored_layers") : q.strings("modules_to_not_convert");
  return c;
}

QuantConfig parse_hf_quant_config(std::string_view json_text, const std::string& path) {
  nlohmann::json j = parse_json_text(json_text, path);
  JsonFields root(j, path, "");
  // Some producers write the ModelOpt keys at the top level instead of under "quantization".
  if (root.has("quantization")) return parse_modelopt(root.object("quantization"));
  if (!root.has("quant_algo") && !root.has("kv_cache_quant_algo"))
    root.fail("quantization", "missing (expected the ModelOpt \"quantization\" object)");
  return parse_modelopt(root);
}

QuantConfig parse_config_json_quantization(std::string_view json_text, const std::string& path) {
  nlohmann::json j = parse_json_text(json_text, path);
  JsonFields root(j, path, "");
  if (!root.has("quantization_config")) return QuantConfig{};
  JsonFields q = root.object("quantization_config");
  std::string method = q.str("quant_method");
  if (method == "modelopt" || method == "modelopt_fp4") {
    return q.has("quantization") ? parse_modelopt(q.object("quantization")) : parse_modelopt(q);
  }
  if (method == "compressed-tensors") return parse_compressed_tensors(q);
  if (method == "fp8") return parse_fp8_method(q);
  q.fail("quant_method", fmt::format("unsupported quantization method \"{}\" (serval supports "
                                     "modelopt, compressed-tensors, fp8)",
                                     method));
}

QuantConfig load_quant_config(const std::string& model_dir) {
  std::filesystem::path dir(model_dir);
  std::filesystem::path hf = dir / "hf_quant_config.json";
  if (std::filesystem::exists(hf)) return parse_hf_quant_config(read_file(hf), hf.string());
  std::filesystem::path cfg = dir / "config.json";
  if (std::filesystem::exists(cfg))
    return parse_config_json_quantization(read_file(cfg), cfg.string());
  return QuantConfig{};
}

void check_requested_quantization(const QuantConfig& c, std::string_view requested) {
  if (requested.empty() || requested == c.vllm_name) return;
  if (requested == "modelopt" && c.vllm_name == "modelopt_fp4") return;
  if (c.vllm_name.empty())
    throw InvalidArgument(fmt::format(
        "--quantization {}: the checkpoint is not quantized, and serval does not quantize weights "
        "at load; serve a checkpoint quantized with {} or leave the flag out",
        requested, requested));
  throw InvalidArgument(fmt::format(
      "--quantization {} does not match the checkpoint's quantization '{}' (from {}); leave the "
      "flag out to use the checkpoint's",
      requested, c.vllm_name, c.source));
}

bool glob_match(std::string_view pattern, std::string_view name) {
  // Greedy match with one backtrack point: the last '*' seen and where it started matching.
  size_t pi = 0, ni = 0;
  size_t star_p = std::string_view::npos, star_n = 0;
  while (ni < name.size()) {
    if (pi < pattern.size()) {
      char pc = pattern[pi];
      if (pc == '*') {
        star_p = pi++;
        star_n = ni;
        continue;
      }
      if (pc == '?') {
        ++pi, ++ni;
        continue;
      }
      if (pc == '[') {
        size_t end = 0;
        bool hit = match_set(pattern, pi, name[ni], &end);
        if (end != std::string_view::npos) {
          if (hit) {
            pi = end, ++ni;
            continue;
          }
        } else if (name[ni] == '[') {  // unterminated set: a literal '['
          ++pi, ++ni;
          continue;
        }
      } else if (pc == name[ni]) {
        ++pi, ++ni;
        continue;
      }
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p + 1;
    ni = ++star_n;
  }
  while (pi < pattern.size() && pattern[pi] == '*') ++pi;
  return pi == pattern.size();
}

bool regex_match_prefix(const std::string& pattern, std::string_view name) {
  return std::regex_search(name.begin(), name.end(), compiled(pattern),
                           std::regex_constants::match_continuous);
}

bool is_quantized(const QuantConfig& c, std::string_view module_name) {
  if (c.method == Method::kNone) return false;
  for (const std::string& n : c.exclude_names)
    if (n == module_name) return false;
  for (const std::string& g : c.exclude_globs)
    if (glob_match(g, module_name)) return false;
  for (const std::string& r : c.exclude_regexes)
    if (regex_match_prefix(r, module_name)) return false;
  if (c.target_names.empty() && c.target_regexes.empty()) return true;
  for (const std::string& n : c.target_names)
    if (n == module_name) return true;
  for (const std::string& r : c.target_regexes)
    if (regex_match_prefix(r, module_name)) return true;
  return false;
}

bool shards_quantized(const QuantConfig& c, const std::vector<std::string>& shard_names) {
  if (shard_names.empty()) throw InvalidArgument("shards_quantized: no shard names");
  bool first = is_quantized(c, shard_names[0]);
  for (size_t i = 1; i < shard_names.size(); ++i) {
    if (is_quantized(c, shard_names[i]) != first)
      throw LoadError(
          fmt::format("{}: '{}' is {} but '{}' is {}; shards fused into one module need one format",
                      c.source, shard_names[0], first ? "quantized" : "excluded", shard_names[i],
                      first ? "excluded" : "quantized"));
  }
  return first;
}

}  // namespace serval::quant
