// How a checkpoint's linear weights are quantized, parsed from hf_quant_config.json or the
// quantization_config of config.json, and which modules the quantization skips.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace serval::quant {

struct QuantConfig {
  enum class Method {
    kNone,           // unquantized checkpoint (possibly with FP8 KV-cache scales only)
    kNvfp4,          // E2M1 values, E4M3 scale per 16 along K, fp32 global scale (SPEC 2.1)
    kFp8PerTensor,   // E4M3 weight, one fp32 weight_scale per tensor
    kFp8PerChannel,  // E4M3 weight, one scale per output row
    kFp8Block,       // E4M3 weight, one fp32 scale per block_size[0] x block_size[1] tile
  };
  Method method = Method::kNone;
  int group_size = 0;                   // NVFP4: 16 (elements along K per E4M3 scale); else 0
  std::array<int, 2> block_size{0, 0};  // kFp8Block: [rows (N), cols (K)], usually [128, 128]
  // The checkpoint holds a per-tensor activation scale for every quantized linear
  // (ModelOpt/FP8 input_scale, compressed-tensors NVFP4 input_global_scale). False: activations
  // are quantized dynamically (per token / per block) or not at all (see weight_only).
  bool static_activations = false;
  bool weight_only = false;   // activations stay in the model dtype (W4A16, FP8_PB_WO)
  bool kv_cache_fp8 = false;  // the checkpoint declares an FP8 KV cache (k/v scales expected)
  // --nvfp4-activations: NVFP4 linears also quantize their input activations (W4A4, SPEC 2.2)
  // with the checkpoint's static input scale. Needs method kNvfp4 with static_activations.
  bool nvfp4_activations = false;
  // Modules left unquantized. Matching rules (see is_quantized):
  std::vector<std::string> exclude_names;    // exact module names
  std::vector<std::string> exclude_globs;    // fnmatch patterns, full match (ModelOpt)
  std::vector<std::string> exclude_regexes;  // ECMAScript, anchored at the start only (re.match)
  // compressed-tensors config_groups targets naming modules rather than "Linear"; when any is
  // set, only matching modules are quantized. Empty: every linear not excluded is quantized.
  std::vector<std::string> target_names;
  std::vector<std::string> target_regexes;
  std::string source;  // the file the description came from; empty when unquantized
  // The name vLLM's --quantization gives this checkpoint format: "modelopt_fp4" (ModelOpt
  // NVFP4), "modelopt" (ModelOpt FP8 kinds), "compressed-tensors", "fp8"; empty when unquantized.
  std::string vllm_name;
  // compressed-tensors NVFP4 stores weight_global_scale = 1/weight_scale_2 and
  // input_global_scale = 1/input_scale.
  bool reciprocal_global_scales = false;
  // Suffix of the FP8 block-scale tensor: "weight_scale_inv" (DeepSeek "fp8") or
  // "weight_scale" (compressed-tensors, ModelOpt FP8_PB_WO).
  std::string block_scale_name;
};

std::string_view method_name(QuantConfig::Method m);

// The values `serve --quantization` (vLLM's flag) accepts, and its check at load: the value must
// name the checkpoint's own format ("modelopt" also covers ModelOpt NVFP4, as in vLLM). serval
// does not quantize at load, so an unquantized checkpoint fails too. InvalidArgument naming both.
inline constexpr std::string_view kQuantizationChoices[] = {"modelopt", "modelopt_fp4", "fp8",
                                                            "compressed-tensors"};
void check_requested_quantization(const QuantConfig& c, std::string_view requested);
// One line for the start-up log, e.g. "nvfp4 (group 16, static act) from .../hf_quant_config.json,
// kv fp8, 2 excluded patterns".
std::string describe(const QuantConfig& c);

// Parses hf_quant_config.json text (ModelOpt: {"quantization": {"quant_algo", "group_size",
// "kv_cache_quant_algo", "exclude_modules"}}, or the same keys at top level). `path` is used in
// messages. LoadError names the file and key for malformed JSON, unknown algorithms and fields
// of the wrong type.
QuantConfig parse_hf_quant_config(std::string_view json_text, const std::string& path);
// Parses config.json text: its "quantization_config" (quant_method "modelopt" |
// "compressed-tensors" | "fp8"). Method kNone with an empty source when the key is absent.
QuantConfig parse_config_json_quantization(std::string_view json_text, const std::string& path);
// hf_quant_config.json when the folder has one (ModelOpt's file wins, as in vLLM), else
// config.json's quantization_config, else an unquantized config.
QuantConfig load_quant_config(const std::string& model_dir);

// Glob match of the whole name: '*' any run of characters (dots included, as Python fnmatch),
// '?' one character, "[abc]" / "[a-z]" / "[!abc]" one character of (not of) the set.
bool glob_match(std::string_view pattern, std::string_view name);
// Python re.match: ECMAScript `pattern` matching a prefix of `name` (not necessarily all of it).
// InvalidArgument for a malformed pattern.
bool regex_match_prefix(const std::string& pattern, std::string_view name);

// Whether the linear module `module_name` (checkpoint name without ".weight", e.g.
// "model.layers.0.self_attn.q_proj") is quantized: false for Method::kNone and for a module
// any exclude entry matches, or (when targets are set) that no target matches.
bool is_quantized(const QuantConfig& c, std::string_view module_name);
// For a module fused from checkpoint shards (q/k/v, gate/up): whether the shards are
// quantized; LoadError when some are and some are not (the fused weight needs one format).
bool shards_quantized(const QuantConfig& c, const std::vector<std::string>& shard_names);

}  // namespace serval::quant
