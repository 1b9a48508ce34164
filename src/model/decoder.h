// A pre-norm decoder-only transformer (Llama family); architectures describe their differences
// in a DecoderSpec and share this forward.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "model/layers/layers.h"
#include "model/model.h"

namespace serval::model {

struct DecoderSpec {
  bool qk_norm = false;  // per-head RMSNorm of q and k before RoPE (Qwen3)
  // MoE names for layer i, or nullopt for a dense MLP layer.
  std::function<std::optional<MoeNames>(int layer)> moe_names;
  int moe_inter = 0;  // expert intermediate size
  // Beside the experts of every MoE layer, a dense MLP of width shared_expert_intermediate_size:
  // "{mlp}.{shared_expert}" ("": none), gated by sigmoid("{mlp}.shared_expert_gate" · x) when
  // shared_expert_gated (Qwen2-MoE's "shared_expert"), else added (DeepSeek's "shared_experts").
  std::string shared_expert;
  bool shared_expert_gated = false;
  // Multi-head latent attention (ModelConfig::mla, DeepSeek) instead of Attention.
  bool mla = false;
};

class Decoder final : public Model {
 public:
  Decoder(const io::ModelConfig& c, const DecoderSpec& spec, const WeightSource& w,
          backend::Backend& b, const LoadOptions& options);
  const io::ModelConfig& config() const override { return c_; }
  KvGeometry kv_geometry() const override;
  Tensor forward(const backend::StepMetadata& meta,
                 std::vector<backend::KvCacheLayer>& kv_cache) override;
  std::string moe_backend() const override { return moe_backend_; }

 private:
  struct Layer {
    Tensor input_norm, post_attention_norm;
    std::unique_ptr<AttentionLayer> attn;
    std::unique_ptr<Mlp> mlp;            // dense layers
    std::unique_ptr<MoeBlock> moe;       // sparse layers
    std::unique_ptr<Mlp> shared_expert;  // sparse layers with DecoderSpec::shared_expert
    Tensor shared_expert_gate;           // [1, hidden]; undefined: not gated
  };
  // out += shared_expert(x), scaled by sigmoid(x · gateᵀ) when gated: the shared expert's part;
  // reduce: its (tensor-parallel partial) output all-reduced over shard_.comm first.
  void add_shared_expert(Layer& layer, const Tensor& x, Tensor& out, bool reduce = false);
  io::ModelConfig c_;
  backend::Backend& b_;
  bool pooling_ = false;  // LoadOptions::pooling
  ShardSpec shard_;
  KvGeometry kv_;      // this rank's cache geometry
  dist::Range vocab_;  // LM-head rows (vocabulary entries) this rank computes logits for
  // lm_head_: rows vocab_ of the LM head (of the embedding when tied); embed_ is replicated.
  Tensor embed_, final_norm_, lm_head_, inv_freq_;
  std::vector<Layer> layers_;
  std::string moe_backend_;
};

}  // namespace serval::model
