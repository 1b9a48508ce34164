#include "io/model_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <limits>

#include "base/error.h"
#include "io/json_reader.h"

namespace serval::io {
namespace {

using nlohmann::json;

// Hugging Face defaults of the config classes (transformers 4.5x) for keys a config may omit.
struct ArchDefaults {
  int max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  bool qk_norm = false;
  bool qkv_bias = false;
  bool fused_projections = false;
  // MoE defaults; num_experts == 0 means the architecture is dense unless the config says so.
  int num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  bool deepseek = false, deepseek_v3 = false;  // MLA and DeepSeek's MoE keys (parse_deepseek)
};

ArchDefaults arch_defaults(const std::string& model_type, const std::string& arch) {
  ArchDefaults d;
  if (model_type == "qwen3" || arch == "Qwen3ForCausalLM") {
    d.max_position_embeddings = 32768;
    d.qk_norm = true;
  } else if (model_type == "qwen3_moe" || arch == "Qwen3MoeForCausalLM") {
    d.max_position_embeddings = 32768;
    d.qk_norm = true;
    d.num_experts = 128;
    d.num_experts_per_tok = 8;
    d.moe_intermediate_size = 768;
    d.norm_topk_prob = false;
  } else if (model_type == "qwen2_moe" || arch == "Qwen2MoeForCausalLM") {
    d.max_position_embeddings = 32768;
    d.qkv_bias = true;
    d.num_experts = 60;
    d.num_experts_per_tok = 4;
    d.moe_intermediate_size = 1408;
    d.shared_expert_intermediate_size = 5632;
    d.norm_topk_prob = false;
  } else if (model_type == "qwen2" || arch == "Qwen2ForCausalLM") {
    d.max_position_embeddings = 32768;
    d.qkv_bias = true;
  } else if (model_type == "phi3" || arch == "Phi3ForCausalLM") {
    d.max_position_embeddings = 4096;
    d.rms_norm_eps = 1e-5f;
    d.fused_projections = true;
  } else if (model_type == "mistral" || arch == "MistralForCausalLM") {
    d.max_position_embeddings = 4096 * 32;
  } else if (model_type == "deepseek_v2" || arch == "DeepseekV2ForCausalLM") {
    d.max_position_embeddings = 2048;
    d.num_experts = 64;
    d.moe_intermediate_size = 1407;
    d.norm_topk_prob = false;
    d.deepseek = true;
  } else if (model_type == "deepseek_v3" || arch == "DeepseekV3ForCausalLM") {
    d.max_position_embeddings = 4096;
    d.num_experts = 256;
    d.num_experts_per_tok = 8;
    d.moe_intermediate_size = 2048;
    d.norm_topk_prob = true;
    d.deepseek = true;
    d.deepseek_v3 = true;
  } else if (model_type == "mixtral" || arch == "MixtralForCausalLM") {
    d.max_position_embeddings = 4096 * 32;
    d.rms_norm_eps = 1e-5f;
    d.rope_theta = 1e6f;
    d.num_experts = 8;
    d.num_experts_per_tok = 2;
    d.norm_topk_prob = true;
  }
  return d;
}

// An integer key that must fit in int and lie in [lo, INT_MAX].
int checked_int(const JsonReader& r, std::string_view key, int64_t v, int64_t lo) {
  if (v < lo || v > INT_MAX)
    r.fail(key, fmt::format("must be in [{}, {}], got {}", lo, INT_MAX, v));
  return int(v);
}
// Layer and expert counts: the loader walks every layer and expert several times (names,
// sizes, shapes) before it reads a tensor, so 10^9 layers took minutes to fail. Real models
// have ~100 layers and at most a few hundred experts.
constexpr int kMaxCount = 65536;
void check_count(const JsonReader& r, std::string_view key, int v) {
  if (v > kMaxCount) r.fail(key, fmt::format("must be at most {}, got {}", kMaxCount, v));
}

int req_int(const JsonReader& r, std::string_view key, int64_t lo) {
  return checked_int(r, key, r.get_int(key), lo);
}
int opt_int(const JsonReader& r, std::string_view key, int def, int64_t lo) {
  auto v = r.opt_int(key);
  return v ? checked_int(r, key, *v, lo) : def;
}
float positive_float(const JsonReader& r, std::string_view key, float def) {
  auto v = r.opt_number(key);
  if (!v) return def;
  if (!(*v > 0)) r.fail(key, fmt::format("must be > 0, got {}", *v));
  return float(*v);
}

// eos_token_id: an integer, a list of integers, or absent/null.
std::vector<int32_t> token_ids(const JsonReader& r, std::string_view key) {
  std::vector<int32_t> ids;
  const json* v = r.find(key);
  if (!v) return ids;
  auto one = [&](const json& x) {
    if (!x.is_number()) r.fail(key, fmt::format("must hold integers, got {}", json_type_name(x)));
    ids.push_back(checked_int(r, key, r.as_int(x, key), 0));
  };
  if (v->is_array()) {
    for (const json& x : *v) one(x);
  } else {
    one(*v);
  }
  return ids;
}

// YaRN's magnitude correction for a context stretched `scale` times (the paper's 0.1·ln s + 1).
double yarn_mscale(double scale, double mscale = 1.0) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The yarn keys of a rope dict (transformers' _compute_yarn_parameters reads them alike).
void parse_yarn(const JsonReader& r, int max_position_embeddings, RopeScaling& s) {
  s.original_max_position_embeddings =
      opt_int(r, "original_max_position_embeddings", max_position_embeddings, 1);
  // Without a factor (DeepSeek-V3-style configs): the ratio of the two lengths.
  s.factor = float(r.opt_number("factor").value_or(double(max_position_embeddings) /
                                                   s.original_max_position_embeddings));
  if (!(s.factor > 0)) r.fail("factor", fmt::format("must be > 0, got {}", s.factor));
  s.beta_fast = float(r.opt_number("beta_fast").value_or(32));
  s.beta_slow = float(r.opt_number("beta_slow").value_or(1));
  if (!(s.beta_fast > 0) || !(s.beta_slow > 0))
    r.fail("beta_fast", fmt::format("beta_fast and beta_slow must be > 0 (got {} and {})",
                                    s.beta_fast, s.beta_slow));
  s.truncate = r.opt_bool("truncate").value_or(true);
  const double mscale = r.opt_number("mscale").value_or(0);
  const double mscale_all_dim = r.opt_number("mscale_all_dim").value_or(0);
  if (mscale_all_dim != 0) {
    const double m = yarn_mscale(s.factor, mscale_all_dim);
    s.mla_softmax_factor = float(m * m);
  }
  if (const auto a = r.opt_number("attention_factor")) {
    s.attention_factor = float(*a);
  } else if (mscale != 0 && mscale_all_dim != 0) {
    s.attention_factor =
        float(yarn_mscale(s.factor, mscale) / yarn_mscale(s.factor, mscale_all_dim));
  } else {
    s.attention_factor = float(yarn_mscale(s.factor));
  }
  if (!(s.attention_factor > 0))
    r.fail("attention_factor", fmt::format("must be > 0, got {}", s.attention_factor));
}

// One rope dict: rope_scaling (type key required) or rope_parameters (type defaults to default).
RopeScaling parse_rope_dict(const JsonReader& r, bool type_required, int max_position_embeddings) {
  RopeScaling s;
  auto type = r.opt_string("rope_type");
  if (!type) type = r.opt_string("type");
  if (!type) {
    if (type_required) r.fail("rope_type", "is missing (required: 'rope_type' or 'type')");
    return s;
  }
  s.type = *type;
  if (s.type == "default") return s;
  if (s.type == "yarn") {
    parse_yarn(r, max_position_embeddings, s);
    return s;
  }
  if (s.type != "linear" && s.type != "llama3") {
    r.fail("rope_type",
           fmt::format("'{}' is not supported (supported: default, linear, llama3, yarn)", s.type));
  }
  s.factor = float(r.get_number("factor"));
  if (!(s.factor > 0)) r.fail("factor", fmt::format("must be > 0, got {}", s.factor));
  if (s.type == "llama3") {
    s.low_freq_factor = float(r.get_number("low_freq_factor"));
    s.high_freq_factor = float(r.get_number("high_freq_factor"));
    s.original_max_position_embeddings = req_int(r, "original_max_position_embeddings", 1);
    if (!(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor)) {
      r.fail("high_freq_factor", fmt::format("must exceed low_freq_factor > 0 (got {} and {})",
                                             s.high_freq_factor, s.low_freq_factor));
    }
  }
  return s;
}

// rope_theta and rope_scaling (transformers 4) or rope_parameters (transformers 5).
void parse_rope(const JsonReader& top, float default_theta, ModelConfig& c) {
  c.rope_theta = positive_float(top, "rope_theta", default_theta);
  if (const json* p = top.find("rope_parameters")) {
    JsonReader r(*p, top.path(), "rope_parameters.");
    c.rope_theta = positive_float(r, "rope_theta", c.rope_theta);
    c.rope_scaling = parse_rope_dict(r, /*type_required=*/false, c.max_position_embeddings);
  } else if (const json* s = top.find("rope_scaling")) {
    c.rope_scaling = parse_rope_dict(JsonReader(*s, top.path(), "rope_scaling."), true,
                                     c.max_position_embeddings);
  }
}

void parse_moe(const JsonReader& r, const ArchDefaults& d, ModelConfig& c) {
  const char* experts_key = r.has("num_local_experts")  ? "num_local_experts"
                            : r.has("n_routed_experts") ? "n_routed_experts"
                                                        : "num_experts";
  c.num_experts = opt_int(r, experts_key, d.num_experts, 0);
  check_count(r, experts_key, c.num_experts);
  if (c.num_experts == 0) return;
  c.num_experts_per_tok = opt_int(r, "num_experts_per_tok", d.num_experts_per_tok, 1);
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
    r.fail("num_experts_per_tok", fmt::format("must be in [1, {}] ({}), got {}", c.num_experts,
                                              experts_key, c.num_experts_per_tok));
  }
  // Mixtral-style configs size experts with intermediate_size.
  int expert_default = d.moe_intermediate_size ? d.moe_intermediate_size : c.intermediate_size;
  c.moe_intermediate_size = opt_int(r, "moe_intermediate_size", expert_default, 1);
  c.norm_topk_prob = r.opt_bool("norm_topk_prob").value_or(d.norm_topk_prob);
  c.shared_expert_intermediate_size =
      opt_int(r, "shared_expert_intermediate_size", d.shared_expert_intermediate_size, 0);
  c.decoder_sparse_step = opt_int(r, "decoder_sparse_step", 1, 1);
  c.mlp_only_layers.clear();
  if (const json* v = r.find("mlp_only_layers")) {
    if (!v->is_array()) {
      r.fail("mlp_only_layers", fmt::format("must be an array, got {}", json_type_name(*v)));
    }
    for (const json& x : *v) {
      if (!x.is_number()) r.fail("mlp_only_layers", "must hold integers");
      int64_t i = r.as_int(x, "mlp_only_layers");
      if (i < 0 || i >= c.num_hidden_layers) {
        r.fail("mlp_only_layers",
               fmt::format("holds layer {} outside [0, {})", i, c.num_hidden_layers));
      }
      c.mlp_only_layers.push_back(int(i));
    }
  }
}

// DeepSeek-V2/V3: multi-head latent attention and the MoE keys of their configs.
void parse_deepseek(const JsonReader& r, const ArchDefaults& d, ModelConfig& c) {
  MlaConfig& m = c.mla;
  const json* q_lora = r.find("q_lora_rank");
  m.q_lora_rank = q_lora && !q_lora->is_null() ? req_int(r, "q_lora_rank", 1) : 0;
  if (!q_lora && d.deepseek_v3) m.q_lora_rank = 1536;
  m.kv_lora_rank = opt_int(r, "kv_lora_rank", 512, 1);
  m.qk_nope_head_dim = opt_int(r, "qk_nope_head_dim", 128, 1);
  m.qk_rope_head_dim = opt_int(r, "qk_rope_head_dim", 64, 2);
  m.v_head_dim = opt_int(r, "v_head_dim", 128, 1);
  if (m.qk_rope_head_dim % 2 != 0)
    r.fail("qk_rope_head_dim", fmt::format("must be even, got {}", m.qk_rope_head_dim));
  // V2's rotary is always interleaved (complex pairs); V3's unless the config says otherwise.
  m.rope_interleave = !d.deepseek_v3 || r.opt_bool("rope_interleave").value_or(true);
  c.head_dim = m.qk_rope_head_dim;  // the rotary tables' width (transformers sets it so too)
  if (c.num_experts == 0) return;
  c.first_k_dense_replace = opt_int(r, "first_k_dense_replace", d.deepseek_v3 ? 3 : 0, 0);
  c.moe_layer_freq = opt_int(r, "moe_layer_freq", 1, 1);
  c.n_shared_experts = opt_int(r, "n_shared_experts", d.deepseek_v3 ? 1 : 2, 0);
  check_count(r, "n_shared_experts", c.n_shared_experts);
  c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  c.routed_scaling_factor = positive_float(r, "routed_scaling_factor", d.deepseek_v3 ? 2.5f : 1.0f);
  const std::string scoring =
      r.opt_string("scoring_func").value_or(d.deepseek_v3 ? "sigmoid" : "softmax");
  std::string method = r.opt_string("topk_method").value_or(d.deepseek_v3 ? "noaux_tc" : "greedy");
  const json* groups = r.find("n_group");
  c.n_group = groups && !groups->is_null() ? req_int(r, "n_group", 1) : 1;
  const json* topk_groups = r.find("topk_group");
  c.topk_group = topk_groups && !topk_groups->is_null() ? req_int(r, "topk_group", 1) : c.n_group;
  if (c.topk_group > c.n_group)
    r.fail("topk_group", fmt::format("({}) must not exceed n_group ({})", c.topk_group, c.n_group));
  // Limiting the groups to all of them is plain greedy top-k.
  if (method == "group_limited_greedy" && c.topk_group == c.n_group) method = "greedy";
  if (method == "noaux_tc" && scoring == "sigmoid") {
    c.moe_sigmoid_grouped = true;
    if (c.num_experts % c.n_group != 0)
      r.fail("n_group",
             fmt::format("({}) must divide n_routed_experts ({})", c.n_group, c.num_experts));
  } else if (method != "greedy" || scoring != "softmax") {
    r.fail("topk_method",
           fmt::format("'{}' with scoring_func '{}' is not supported (supported: greedy with "
                       "softmax, noaux_tc with sigmoid)",
                       method, scoring));
  }
}

}  // namespace

bool ModelConfig::is_moe_layer(int i) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (i < first_k_dense_replace || i % moe_layer_freq != 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end()) {
    return false;
  }
  return (i + 1) % decoder_sparse_step == 0;
}

namespace {

// Parameters of the weights, exactly: every dimension is below 2^31 and the layer and expert
// counts at most 2^16 (parse_model_config), so no product here comes near 2^127. (In int64 a
// hostile config.json overflowed into a negative count, and the weight sizes derived from it.)
__int128 parameter_count(const ModelConfig& c) {
  using i128 = __int128;
  const i128 h = c.hidden_size, q_dim = i128(c.num_attention_heads) * c.head_dim,
             kv_dim = i128(c.num_key_value_heads) * c.head_dim;
  i128 attn = h * q_dim + 2 * h * kv_dim + q_dim * h;  // q, k, v, o
  if (c.is_mla()) {
    const MlaConfig& m = c.mla;
    const i128 heads = c.num_attention_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const i128 q = m.q_lora_rank > 0
                       ? h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk
                       : h * heads * qk;
    attn = q + h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank        // kv_a, its norm
           + i128(m.kv_lora_rank) * heads * (m.qk_nope_head_dim + m.v_head_dim)  // kv_b
           + heads * m.v_head_dim * h;                                           // o
  }
  if (c.attention_bias) attn += q_dim + 2 * kv_dim + h;
  if (c.qkv_bias && !c.attention_bias) attn += q_dim + 2 * kv_dim;
  if (c.qk_norm) attn += 2 * i128(c.head_dim);
  const i128 dense_mlp =
      3 * h * c.intermediate_size + (c.mlp_bias ? 2 * i128(c.intermediate_size) + h : 0);
  const i128 moe = i128(c.num_experts) * h                                        // router
                   + i128(c.num_experts) * 3 * h * i128(c.moe_intermediate_size)  // experts
                   + (c.shared_expert_intermediate_size > 0                       // shared one
                          ? 3 * h * i128(c.shared_expert_intermediate_size) + h
                          : 0);
  i128 total = i128(c.vocab_size) * h + h;  // embeddings, final norm
  if (!c.tie_word_embeddings) total += i128(c.vocab_size) * h;
  for (int i = 0; i < c.num_hidden_layers; ++i)
    total += attn + 2 * h + (c.is_moe_layer(i) ? moe : dense_mlp);
  return total;
}

// Far above any real model (the largest hold ~2·10^12 parameters), and low enough that every
// size derived from the config (tensor elements, weight bytes at 4 bytes a parameter) fits int64.
constexpr int64_t kMaxParameters = int64_t(1) << 46;

}  // namespace

int64_t ModelConfig::num_parameters() const {
  const __int128 n = parameter_count(*this);
  return n > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : int64_t(n);
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& path) {
  json j = parse_json(json_text, path);
  JsonReader r(j, path);
  ModelConfig c;

  const json* archs = r.find("architectures");
  if (!archs) r.fail("architectures", "is missing (required)");
  if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    r.fail("architectures", "must be a non-empty array of strings");
  }
  c.architecture = (*archs)[0].get<std::string>();
  c.model_type = r.opt_string("model_type").value_or("");
  ArchDefaults d = arch_defaults(c.model_type, c.architecture);

  c.vocab_size = req_int(r, "vocab_size", 1);
  c.hidden_size = req_int(r, "hidden_size", 1);
  c.intermediate_size = req_int(r, "intermediate_size", 1);
  c.num_hidden_layers = req_int(r, "num_hidden_layers", 1);
  check_count(r, "num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = req_int(r, "num_attention_heads", 1);
  c.num_key_value_heads = opt_int(r, "num_key_value_heads", c.num_attention_heads, 1);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    r.fail("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})",
                                              c.num_key_value_heads, c.num_attention_heads));
  }
  if (r.has("head_dim")) {
    c.head_dim = req_int(r, "head_dim", 1);
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    r.fail("head_dim", fmt::format("is missing and hidden_size ({}) is not a multiple of "
                                   "num_attention_heads ({})",
                                   c.hidden_size, c.num_attention_heads));
  } else {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = opt_int(r, "max_position_embeddings", d.max_position_embeddings, 1);
  // A null window, or one switched off by use_sliding_window (Qwen's configs), is none.
  if (const json* w = r.find("sliding_window");
      w && !w->is_null() && r.opt_bool("use_sliding_window").value_or(true))
    c.sliding_window = req_int(r, "sliding_window", 1);
  c.rms_norm_eps = positive_float(r, "rms_norm_eps", d.rms_norm_eps);
  parse_rope(r, d.rope_theta, c);
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings").value_or(false);
  c.attention_bias = r.opt_bool("attention_bias").value_or(false);
  c.mlp_bias = r.opt_bool("mlp_bias").value_or(false);
  c.qk_norm = d.qk_norm;
  c.qkv_bias = r.opt_bool("qkv_bias").value_or(d.qkv_bias);  // Qwen2-MoE's newer configs say
  c.fused_projections = d.fused_projections;
  // RoPE on part of each head (Phi-3.5, Phi-4-mini) is not computed: refused, not ignored.
  if (const auto f = r.opt_number("partial_rotary_factor"); f && *f != 1.0)
    r.fail("partial_rotary_factor",
           fmt::format("{} is not supported (RoPE on whole heads only)", *f));
  c.hidden_act = r.opt_string("hidden_act").value_or("silu");

  const char* dtype_key = r.has("torch_dtype") ? "torch_dtype" : "dtype";
  if (auto s = r.opt_string(dtype_key)) {
    if (!dtype_from_torch_name(*s, &c.torch_dtype)) {
      r.fail(dtype_key, fmt::format("'{}' is not a known dtype (bfloat16, float16, float32)", *s));
    }
  }
  c.eos_token_ids = token_ids(r, "eos_token_id");
  std::vector<int32_t> bos = token_ids(r, "bos_token_id");
  if (bos.size() > 1) r.fail("bos_token_id", "must be a single integer");
  if (!bos.empty()) c.bos_token_id = bos[0];

  parse_moe(r, d, c);
  if (d.deepseek) parse_deepseek(r, d, c);
  if (parameter_count(c) > kMaxParameters) {
    const __int128 n = parameter_count(c);
    throw LoadError(fmt::format(
        "{}: these sizes (hidden_size {}, intermediate_size {}, num_hidden_layers {}, vocab_size "
        "{}, {} heads of {}, {} experts of {}) make {:.3g} parameters, more than 2^46: not a model "
        "serval can hold",
        path, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size,
        c.num_attention_heads, c.head_dim, c.num_experts, c.moe_intermediate_size, double(n)));
  }
  return c;
}

std::string config_json_text(const std::string& model_dir, const std::string& hf_overrides) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  if (!std::filesystem::is_regular_file(path)) {
    throw LoadError(fmt::format("{}: no config.json in model folder '{}'", path, model_dir));
  }
  std::string text = read_text_file(path);
  if (hf_overrides.empty()) return text;
  const json patch = parse_json(hf_overrides, "--hf-overrides");
  if (!patch.is_object())
    throw LoadError("--hf-overrides: expected a JSON object, got " + hf_overrides);
  json config = parse_json(text, path);
  if (!config.is_object()) throw LoadError(path + ": expected a JSON object");
  config.merge_patch(patch);
  return config.dump();
}

ModelConfig load_model_config(const std::string& model_dir, const std::string& hf_overrides) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  return parse_model_config(config_json_text(model_dir, hf_overrides),
                            hf_overrides.empty() ? path : path + " with --hf-overrides");
}

namespace {

// The sampling defaults of a generation_config object (its other keys are not read).
GenerationConfig read_generation_config(const json& j, const std::string& path) {
  GenerationConfig g;
  JsonReader r(j, path);
  // The ranges a request may set them to (server/request_parser.cpp); repetition_penalty 0
  // divided logits by zero, top_p 5 truncated nothing silently.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto num = [&](const char* key, double lo, bool lo_open, double hi) -> std::optional<float> {
    auto v = r.opt_number(key);
    if (!v) return std::nullopt;
    if (!((lo_open ? *v > lo : *v >= lo) && *v <= hi))
      r.fail(key, fmt::format("must be in {}{}, {}], got {}", lo_open ? "(" : "[", lo, hi, *v));
    return float(*v);
  };
  g.temperature = num("temperature", 0, false, kInf);
  g.top_p = num("top_p", 0, true, 1);
  g.min_p = num("min_p", 0, false, 1);
  g.repetition_penalty = num("repetition_penalty", 0, true, kInf);
  if (auto k = r.opt_int("top_k")) {
    if (*k < -1 || *k > INT_MAX)
      r.fail("top_k", fmt::format("must be in [-1, {}], got {}", INT_MAX, *k));
    g.top_k = int(*k);
  }
  if (auto n = r.opt_int("max_new_tokens")) {
    if (*n < 1 || *n > INT_MAX)
      r.fail("max_new_tokens", fmt::format("must be in [1, {}], got {}", INT_MAX, *n));
    g.max_new_tokens = int(*n);
  }
  return g;
}

}  // namespace

GenerationConfig load_generation_config(const std::string& model_dir) {
  std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  json j = parse_json(read_text_file(path), path);
  GenerationConfig g = read_generation_config(j, path);
  JsonReader r(j, path);
  g.eos_token_ids = token_ids(r, "eos_token_id");
  return g;
}

GenerationConfig parse_generation_config_override(const std::string& json_text) {
  const std::string path = "--override-generation-config";
  json j = parse_json(json_text, path);
  if (!j.is_object()) throw LoadError(path + ": expected a JSON object, got " + json_text);
  static constexpr std::string_view kKeys[] = {
      "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens"};
  for (const auto& [key, value] : j.items())
    if (std::ranges::find(kKeys, key) == std::end(kKeys))
      throw LoadError(
          fmt::format("{}: unknown key '{}' (serval takes {})", path, key, fmt::join(kKeys, ", ")));
  return read_generation_config(j, path);
}

}  // namespace serval::io
