#include "model/layers/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "model/layers/dummy_load.h"
#include "model/layers/shard.h"
#include "model/quantized_weight.h"

namespace serval::model {

Tensor concat_rows(const std::vector<Tensor>& parts) {
  Shape shape = parts.at(0).shape;
  shape[0] = 0;
  for (const Tensor& p : parts) {
    check(p.dtype == parts[0].dtype, "concat_rows: equal dtypes");
    shape[0] += p.shape[0];
  }
  Tensor out = host_empty(parts[0].dtype, shape);
  char* dst = static_cast<char*>(out.data);
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.data, p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

std::string module_of(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.size() <= kSuffix.size() ||
      weight_name.compare(weight_name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    throw InvalidArgument("module_of: '" + weight_name + "' does not end in .weight");
  return weight_name.substr(0, weight_name.size() - kSuffix.size());
}

namespace {

dist::Range shifted(dist::Range r, int64_t by) {
  return {r.begin + by, r.end + by};
}

// YaRN (transformers' _compute_yarn_parameters): frequencies below the correction range keep
// their value (extrapolation), those above it are divided by the factor (interpolation), with a
// linear ramp over the range of dimension indices between.
double yarn_inv_freq(const io::ModelConfig& c, int i) {
  const io::RopeScaling& rs = c.rope_scaling;
  const double dim = c.head_dim, base = c.rope_theta;
  // The dimension index whose wavelength turns `rotations` times over the original context.
  const auto correction_dim = [&](double rotations) {
    return dim *
           std::log(rs.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(base));
  };
  double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // no zero-width ramp
  const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
  const double extrapolation = 1.0 / std::pow(base, 2 * i / dim);
  const double extrapolation_weight = 1 - ramp;
  return extrapolation / rs.factor * (1 - extrapolation_weight) +
         extrapolation * extrapolation_weight;
}

}  // namespace

Tensor rope_inv_freq(const io::ModelConfig& c) {
  const int half = c.head_dim / 2;
  Tensor t = host_empty(DType::kF32, {half});
  const io::RopeScaling& rs = c.rope_scaling;
  for (int i = 0; i < half; ++i) {
    if (rs.type == "yarn") {
      t.as<float>()[i] = float(yarn_inv_freq(c, i));
      continue;
    }
    // Same expression as the reference: base^(2i/d) in double, inverted in float.
    double freq = 1.0 / std::pow(double(c.rope_theta), double(2 * i) / c.head_dim);
    if (rs.type == "linear") {
      freq /= rs.factor;
    } else if (rs.type == "llama3") {
      const double low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor;
      const double high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor;
      const double wavelen = 2 * std::numbers::pi / freq;
      if (wavelen > low_wavelen) {
        freq /= rs.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) /
                        (rs.high_freq_factor - rs.low_freq_factor);
        freq = (1 - smooth) * freq / rs.factor + smooth * freq;
      }
    }
    t.as<float>()[i] = float(freq);
  }
  return t;
}

Attention::Attention(const io::ModelConfig& c, const WeightSource& w, backend::Backend& b,
                     const std::string& prefix, bool qk_norm, const dist::TpLayout& tp)
    : b_(b),
      has_qkv_bias_(c.attention_bias || c.qkv_bias),
      has_o_bias_(c.attention_bias && tp.rank == 0) {
  const dist::AttentionShard shard =
      dist::shard_attention(tp, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
  params_.num_q_heads = int(shard.q_heads.size());
  params_.num_kv_heads = int(shard.kv_heads.size());
  params_.head_dim = c.head_dim;
  // YaRN scales cos and sin by its attention factor: q·k by its square, folded in here.
  const float rope_factor = c.rope_scaling.attention_factor;
  params_.scale = rope_factor * rope_factor / std::sqrt(float(c.head_dim));
  params_.rms_norm_eps = c.rms_norm_eps;
  const int64_t H = c.hidden_size;
  const int64_t full_q = int64_t(c.num_attention_heads) * c.head_dim;
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
  q_dim_ = int(shard.q_rows.size());
  if (c.fused_projections) {  // one qkv_proj [q + 2·kv, H]: each part its rows of it
    const std::string qkv = prefix + ".qkv_proj";
    const int64_t rows = full_q + 2 * kv_dim;
    wqkv_ = load_linear_sharded(w, b,
                                {{qkv, rows, shard.q_rows},
                                 {qkv, rows, shifted(shard.kv_rows, full_q)},
                                 {qkv, rows, shifted(shard.kv_rows, full_q + kv_dim)}},
                                H, {0, H});
  } else {
    wqkv_ = load_linear_sharded(w, b,
                                {{prefix + ".q_proj", full_q, shard.q_rows},
                                 {prefix + ".k_proj", kv_dim, shard.kv_rows},
                                 {prefix + ".v_proj", kv_dim, shard.kv_rows}},
                                H, {0, H});
  }
  wo_ = load_linear_sharded(w, b, {{prefix + ".o_proj", H, {0, H}}}, full_q, shard.o_cols);
  if (has_qkv_bias_) {
    bqkv_ = load_dense_rows(w, b,
                            {{prefix + ".q_proj.bias", {full_q}, shard.q_rows},
                             {prefix + ".k_proj.bias", {kv_dim}, shard.kv_rows},
                             {prefix + ".v_proj.bias", {kv_dim}, shard.kv_rows}});
  }
  if (has_o_bias_) bo_ = load_dense(w, b, prefix + ".o_proj.bias", {H});
  if (qk_norm) {
    q_norm_ = load_dense(w, b, prefix + ".q_norm.weight", {c.head_dim});
    k_norm_ = load_dense(w, b, prefix + ".k_norm.weight", {c.head_dim});
    params_.q_norm = &q_norm_;
    params_.k_norm = &k_norm_;
  }
}

void Attention::forward(const Tensor& x, const backend::StepMetadata& meta, const Tensor& inv_freq,
                        backend::KvCacheLayer& cache, Tensor& out) {
  const DType act = b_.activation_dtype();
  Tensor qkv = b_.empty(act, {x.dim(0), wqkv_.out_features()});
  b_.linear(x, wqkv_, has_qkv_bias_ ? &bqkv_ : nullptr, qkv);
  Tensor attn = b_.empty(act, {qkv.dim(0), q_dim_});
  backend::AttentionParams p = params_;
  p.inv_freq = &inv_freq;
  b_.attention(qkv, p, cache, meta, attn);
  b_.linear(attn, wo_, has_o_bias_ ? &bo_ : nullptr, out);
}

Mlp::Mlp(const io::ModelConfig& c, int inter, const WeightSource& w, backend::Backend& b,
         const std::string& gate, const std::string& up, const std::string& down,
         const dist::TpLayout& tp)
    : b_(b), hidden_(c.hidden_size) {
  const dist::Range keep = dist::shard_intermediate(tp, inter);
  inter_ = int(keep.size());
  // gate == up: one fused gate_up_proj [2·inter, H], gate rows first.
  const bool fused = gate == up;
  const int64_t rows = fused ? 2 * int64_t(inter) : inter;
  gate_up_ = load_linear_sharded(
      w, b,
      {{module_of(gate), rows, keep}, {module_of(up), rows, fused ? shifted(keep, inter) : keep}},
      hidden_, {0, hidden_},
      /*gate_up=*/true);
  down_ = load_linear_sharded(w, b, {{module_of(down), hidden_, {0, hidden_}}}, inter, keep);
}

void Mlp::forward(const Tensor& x, Tensor& out) {
  Tensor a = b_.empty(b_.activation_dtype(), {x.dim(0), inter_});
  b_.linear_silu_mul(x, gate_up_, a);
  b_.linear(a, down_, nullptr, out);
}

namespace {

std::string expert_name(const MoeNames& n, int e, const std::string& proj) {
  std::string s = n.expert_fmt;
  s.replace(s.find("{e}"), 3, std::to_string(e));
  s.replace(s.find("{proj}"), 6, proj);
  return s;
}

}  // namespace

MoeBlock::MoeBlock(const io::ModelConfig& c, int inter, const WeightSource& w, backend::Backend& b,
                   const MoeNames& names, const std::string& expert_backend,
                   const std::optional<dist::MoeShard>& shard)
    : b_(b) {
  const int E = c.num_experts, H = c.hidden_size;
  const dist::Range experts = shard ? shard->experts : dist::Range{0, E};
  const dist::Range keep = shard ? shard->intermediate : dist::Range{0, inter};
  const int I = int(keep.size()), L = int(experts.size());
  w_.num_experts = E;
  w_.top_k = c.num_experts_per_tok;
  w_.hidden = H;
  w_.inter = I;
  w_.routing = c.moe_sigmoid_grouped ? kernels::RoutingMethod::kSigmoidGroupedTopK
                                     : kernels::RoutingMethod::kSoftmaxTopK;
  w_.renormalize = c.norm_topk_prob;
  w_.num_groups = c.n_group;
  w_.topk_groups = c.topk_group;
  w_.routed_scaling_factor = c.routed_scaling_factor;
  if (!names.correction_bias.empty()) {  // fp32 whatever its stored dtype (the router math's)
    const Tensor stored = w.get(names.correction_bias, {E});
    Tensor bias = host_empty(DType::kF32, {E});
    kernels::cpu::to_float(stored.data, stored.dtype, bias.as<float>(), E);
    w_.correction_bias = b.upload(bias);
  }
  w_.local_offset = int(experts.begin);
  w_.num_local = L;
  // Routers stay unquantized whatever the quantization config says, as in vLLM (DeepSeek's FP8
  // checkpoints exclude nothing yet store the gate in bf16); one stored quantized is refused.
  if (!w.is_dummy()) {
    const DType stored = w.get_stored(names.router).dtype;
    if (stored != DType::kBF16 && stored != DType::kF16 && stored != DType::kF32)
      throw LoadError(w.quant_config().source + ": the MoE router '" + names.router +
                      "' is stored as " + std::string(dtype_name(stored)) +
                      "; serval needs routers in a float dtype");
  }
  w_.router = load_dense(w, b, names.router, {E, H});
  w_.expert_backend = expert_backend;
  if (device_dummy(w, b)) {
    const std::string projs[3] = {names.gate, names.up, names.down};
    load_dummy_experts(
        w, b, [&](int e, int proj) { return module_of(expert_name(names, e, projs[proj])); },
        experts, inter, keep, H, w_);
    b.prepare_moe(w_);
    return;
  }
  std::vector<Tensor> gate_up, down;
  std::vector<backend::QuantizedWeight> gate_up_q, down_q;
  for (int e = int(experts.begin); e < int(experts.end); ++e) {
    backend::Weight gu =
        read_linear_sharded(w,
                            {{module_of(expert_name(names, e, names.gate)), inter, keep},
                             {module_of(expert_name(names, e, names.up)), inter, keep}},
                            H, {0, H});
    backend::Weight dn = read_linear_sharded(
        w, {{module_of(expert_name(names, e, names.down)), H, {0, H}}}, inter, keep);
    if (gu.quantized() != dn.quantized() ||
        (e > experts.begin && gu.quantized() != !gate_up_q.empty()))
      throw LoadError(w.quant_config().source + ": the experts of " + names.router +
                      " mix quantized and unquantized projections (expert " + std::to_string(e) +
                      "); they need one format");
    if (gu.quantized()) {
      gate_up_q.push_back(std::move(*gu.q));
      down_q.push_back(std::move(*dn.q));
    } else {
      gate_up.push_back(gu.dense);
      down.push_back(dn.dense);
    }
  }
  if (!gate_up_q.empty()) {
    // Stack one projection at a time so the per-expert copies are freed early.
    w_.gate_up_q = b.upload_quantized(stack_experts(gate_up_q));
    gate_up_q.clear();
    w_.down_q = b.upload_quantized(stack_experts(down_q));
  } else {
    w_.gate_up = b.upload_weight(concat_rows(gate_up).reshape({L, 2 * int64_t(I), H}));
    w_.down = b.upload_weight(concat_rows(down).reshape({L, H, I}));
  }
  b.prepare_moe(w_);
}

void MoeBlock::forward(const Tensor& x, Tensor& out) {
  b_.moe(x, w_, out);
}

bool MoeBlock::forward_add_norm(const Tensor& delta, Tensor& residual, const Tensor& norm_w,
                                float eps, Tensor& x, Tensor& out, const Tensor* next_norm) {
  return b_.add_rms_norm_moe(delta, residual, norm_w, eps, x, w_, out, next_norm);
}

}  // namespace serval::model
