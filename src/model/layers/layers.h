// Decoder building blocks on backend ops: attention, dense MLP, MoE block, rotary tables.
#pragma once
#include <string>

#include <optional>

#include "backend/backend.h"
#include "dist/layout.h"
#include "io/model_config.h"
#include "model/weight_source.h"

namespace serval::model {

// Concatenates host tensors of equal dtype and trailing shape along dim 0 (copy).
Tensor concat_rows(const std::vector<Tensor>& parts);

// "x.y.weight" → "x.y" (InvalidArgument for a name without the suffix).
std::string module_of(const std::string& weight_name);

// inv_freq [head_dim / 2] with the config's rope scaling (default, linear, llama3).
Tensor rope_inv_freq(const io::ModelConfig& c);

// One layer's self-attention: x [T, hidden] → out [T, hidden] (this rank's partial sum under
// tensor parallel), appending the step's keys and values to `cache`.
class AttentionLayer {
 public:
  virtual ~AttentionLayer() = default;
  virtual void forward(const Tensor& x, const backend::StepMetadata& meta, const Tensor& inv_freq,
                       backend::KvCacheLayer& cache, Tensor& out) = 0;
};

class Attention final : public AttentionLayer {
 public:
  // prefix: "model.layers.N.self_attn". tp: this rank's shard (dist::shard_attention): it loads
  // its q/k/v rows and o_proj columns, and forward() returns its partial o_proj output (the
  // caller all-reduces when tp.size > 1). Biases: q/k/v's when c.attention_bias or c.qkv_bias,
  // o's when c.attention_bias (added by rank 0 only, so that the all-reduce adds it once).
  Attention(const io::ModelConfig& c, const WeightSource& w, backend::Backend& b,
            const std::string& prefix, bool qk_norm, const dist::TpLayout& tp = {});
  void forward(const Tensor& x, const backend::StepMetadata& meta, const Tensor& inv_freq,
               backend::KvCacheLayer& cache, Tensor& out) override;

 private:
  backend::Backend& b_;
  backend::AttentionParams params_;
  int q_dim_;
  backend::Weight wqkv_;  // q, k, v projections fused along the output rows (dense or quantized)
  backend::Weight wo_;
  Tensor bqkv_, bo_, q_norm_, k_norm_;
  bool has_qkv_bias_, has_o_bias_;
};

class Mlp {
 public:
  // gate/up/down are full names of the three projections' weights ("....gate_proj.weight"); gate
  // == up names one fused gate_up_proj [2·inter, hidden], gate rows first (Phi-3).
  // tp: this rank keeps gate/up rows and down columns of dist::shard_intermediate; its output is
  // partial when tp.size > 1.
  Mlp(const io::ModelConfig& c, int inter, const WeightSource& w, backend::Backend& b,
      const std::string& gate, const std::string& up, const std::string& down,
      const dist::TpLayout& tp = {});
  void forward(const Tensor& x, Tensor& out);

 private:
  backend::Backend& b_;
  int hidden_, inter_;
  backend::Weight gate_up_, down_;
};

// Names of one MoE block's tensors in a checkpoint.
struct MoeNames {
  std::string router;          // e.g. "model.layers.N.mlp.gate.weight"
  std::string expert_fmt;      // "{prefix}.experts.{e}.{proj}.weight" with {e} and {proj}
  std::string gate, up, down;  // projection names: gate_proj/up_proj/down_proj or w1/w3/w2
  // DeepSeek-V3 (ModelConfig::moe_sigmoid_grouped): the router's selection bias [num_experts].
  std::string correction_bias = {};
};

class MoeBlock {
 public:
  // inter: each expert's intermediate size. shard: the experts and the slice of their
  // intermediate dimension this rank holds (dist::shard_moe); nullopt: all of it.
  MoeBlock(const io::ModelConfig& c, int inter, const WeightSource& w, backend::Backend& b,
           const MoeNames& names, const std::string& expert_backend,
           const std::optional<dist::MoeShard>& shard = std::nullopt);
  void forward(const Tensor& x, Tensor& out);
  // With the norm before the block (Backend::add_rms_norm_moe): residual += delta,
  // x = rms_norm(residual) · norm_w, out = the block on x. out may alias delta. With next_norm
  // (the next block's norm weight, same eps; or null) the backend may also add out to residual
  // and normalize it into x: it returns true then, and out is not to be read.
  bool forward_add_norm(const Tensor& delta, Tensor& residual, const Tensor& norm_w, float eps,
                        Tensor& x, Tensor& out, const Tensor* next_norm);

 private:
  backend::Backend& b_;
  backend::MoeWeights w_;
};

}  // namespace serval::model
