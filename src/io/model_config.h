// config.json and generation_config.json of a Hugging Face model folder, as plain structs.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace serval::io {

// rope_scaling of config.json. type "default" means none.
struct RopeScaling {
  std::string type = "default";  // default | linear | llama3 | yarn
  float factor = 1.0f;
  float low_freq_factor = 1.0f;                 // llama3
  float high_freq_factor = 4.0f;                // llama3
  int original_max_position_embeddings = 8192;  // llama3; yarn (default max_position_embeddings)
  float beta_fast = 32.0f, beta_slow = 1.0f;    // yarn: the ramp between the correction bounds
  bool truncate = true;                         // yarn: bounds rounded outwards to integers
  // yarn: cos and sin are scaled by it (attention_factor, else from mscale / mscale_all_dim as
  // transformers derives it); attention folds its square into the softmax scale. 1 otherwise.
  float attention_factor = 1.0f;
  // yarn with mscale_all_dim (DeepSeek): mscale(factor, mscale_all_dim)², which multi-head latent
  // attention multiplies into its softmax scale; 1 otherwise.
  float mla_softmax_factor = 1.0f;
};

// Multi-head latent attention (DeepSeek-V2/V3): q through an optional q_lora_rank bottleneck
// (0: one q_proj), keys and values from a kv_lora_rank latent (kv_b_proj per head: qk_nope
// key dims then v_head_dim value dims) plus a qk_rope_head_dim rotary key shared by the heads.
struct MlaConfig {
  int q_lora_rank = 0, kv_lora_rank = 0;
  int qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // rotary dims pair as (2i, 2i+1)
};

// Everything the architectures need from config.json. Missing optional keys get the
// Hugging Face defaults of the architecture; missing required keys are a LoadError.
struct ModelConfig {
  std::string architecture;  // architectures[0]
  std::string model_type;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads
  int head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int max_position_embeddings = 0;
  // Attention over the last sliding_window positions only (Mistral v0.1; Qwen with
  // use_sliding_window); 0: full attention. serval attends fully, so the engine keeps
  // max_model_len within the window, where both are the same.
  int sliding_window = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // biases on q, k, v and o projections
  bool qkv_bias = false;        // biases on q, k and v only (Qwen2: always, whatever the config)
  // Phi-3: one qkv_proj [q + 2·kv, hidden] and one gate_up_proj [2·inter, hidden] per layer.
  bool fused_projections = false;
  bool mlp_bias = false;  // biases on gate, up and down projections (Llama)
  bool qk_norm = false;   // per-head RMSNorm on q and k, weight [head_dim] (Qwen3 family)
  std::string hidden_act = "silu";
  DType torch_dtype = DType::kBF16;    // "torch_dtype" or "dtype"
  std::vector<int32_t> eos_token_ids;  // eos_token_id (int or list)
  std::optional<int32_t> bos_token_id;

  // Mixture of experts (Qwen3-MoE, Mixtral). num_experts == 0 means dense.
  int num_experts = 0;  // num_experts | num_local_experts
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;  // per-expert width; for Mixtral copied from intermediate_size
  bool norm_topk_prob = true;     // Mixtral: true (softmax over the top-k)
  // Qwen2-MoE: on every MoE layer a dense SwiGLU "shared expert" of this width beside the routed
  // ones, its output scaled by sigmoid(shared_expert_gate · x); 0: none.
  int shared_expert_intermediate_size = 0;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  // DeepSeek MoE: layers [0, first_k_dense_replace) dense, then every moe_layer_freq-th an MoE
  // layer; n_shared_experts ungated shared experts (shared_expert_intermediate_size holds their
  // total width); routing by softmax top-k, or (moe_sigmoid_grouped: DeepSeek-V3's noaux_tc)
  // sigmoid scores plus the router's e_score_correction_bias for selection within topk_group of
  // n_group groups; the routed weights times routed_scaling_factor.
  int first_k_dense_replace = 0, moe_layer_freq = 1;
  int n_shared_experts = 0;
  bool moe_sigmoid_grouped = false;
  int n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;

  // Multi-head latent attention; is_mla() then, and head_dim is the rotary width.
  MlaConfig mla;
  bool is_mla() const { return mla.kv_lora_rank > 0; }

  // True if layer `i` uses the MoE block (Qwen3-MoE rule, also right for Mixtral; DeepSeek's
  // first_k_dense_replace and moe_layer_freq).
  bool is_moe_layer(int i) const;
  // Number of parameters the weights hold (embeddings and LM head counted once if tied).
  int64_t num_parameters() const;
};

// Parses config.json text. `path` is used in error messages only.
ModelConfig parse_model_config(const std::string& json_text, const std::string& path);
// config.json of `model_dir`, with `hf_overrides` (vLLM's --hf-overrides: empty, or a JSON object
// merged into it as an RFC 7386 merge patch: nested objects merge, null removes a key) applied
// first. The text the model config is read from: config_json_text.
ModelConfig load_model_config(const std::string& model_dir, const std::string& hf_overrides = "");
std::string config_json_text(const std::string& model_dir, const std::string& hf_overrides);

// Sampling defaults from generation_config.json; unset fields stay empty.
struct GenerationConfig {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  // max_new_tokens: a cap on every request's max_tokens (vLLM takes the smaller).
  std::optional<int> max_new_tokens;
  std::vector<int32_t> eos_token_ids;
};
// Returns an empty GenerationConfig when the file does not exist; LoadError if malformed.
GenerationConfig load_generation_config(const std::string& model_dir);
// The sampling defaults of `--override-generation-config` (vLLM's flag): a JSON object of
// temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens, checked as in the file;
// any other key is a LoadError naming the ones taken (a typo would otherwise change nothing).
GenerationConfig parse_generation_config_override(const std::string& json_text);

}  // namespace serval::io
