// Multi-head latent attention (DeepSeek-V2/V3) on backend ops, in the absorbed form: the cache
// holds one latent row per token (Backend::mla_attention), the per-head key projection is folded
// into the queries and the value projection applied to the attention's latent output.
#pragma once
#include <string>

#include "model/layers/layers.h"

namespace serval::model {

class MlaAttention final : public AttentionLayer {
 public:
  // prefix: "model.layers.N.self_attn". tp: this rank keeps its heads (dist::shard_attention):
  // their q rows, kv_b rows and o_proj columns; the latent projection is replicated, and
  // forward() returns the partial o_proj output (the caller all-reduces when tp.size > 1).
  MlaAttention(const io::ModelConfig& c, const WeightSource& w, backend::Backend& b,
               const std::string& prefix, const dist::TpLayout& tp = {});
  // x [T, hidden] → out [T, hidden]; inv_freq [qk_rope_head_dim / 2].
  void forward(const Tensor& x, const backend::StepMetadata& meta, const Tensor& inv_freq,
               backend::KvCacheLayer& cache, Tensor& out) override;

 private:
  backend::Backend& b_;
  backend::MlaParams params_;
  int q_lora_rank_ = 0, v_head_dim_ = 0;
  backend::Weight q_a_, q_b_;  // q_lora_rank > 0: x → q_a → RMSNorm → q_b; else q_b is q_proj
  Tensor q_a_norm_;            // [q_lora_rank]
  backend::Weight kv_a_;       // [latent + rope, hidden]
  Tensor kv_norm_;             // [latent]
  Tensor key_t_;               // [heads, latent, qk_nope]: kv_b's key rows per head, transposed
  Tensor value_;               // [heads, v_head_dim, latent]: kv_b's value rows per head
  backend::Weight o_;          // [hidden, heads · v_head_dim]
};

}  // namespace serval::model
