#include "model/layers/mla.h"

#include <cmath>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_linear.h"
#include "model/layers/dummy_load.h"
#include "model/quantized_weight.h"

namespace serval::model {

namespace {

// transformers builds the latent norms with RMSNorm's default epsilon, not the config's.
constexpr float kLatentNormEps = 1e-6f;

// The linear `module` [rows, k] as host fp32, row-major: dense weights converted, quantized ones
// dequantized by the CPU reference (kernels::cpu::dequant_weight_row).
std::vector<float> dequantized_rows(const WeightSource& w, const std::string& module, int64_t rows,
                                    int64_t k) {
  const backend::Weight host = read_linear(w, {{module, rows}}, k);
  std::vector<float> out(size_t(rows * k));
  if (!host.q) {
    kernels::cpu::to_float(host.dense.data, host.dense.dtype, out.data(), rows * k);
    return out;
  }
  const backend::QuantizedWeight& q = *host.q;
  kernels::QuantLinearParams p{};
  p.format = q.format;
  p.w = q.data.as<const uint8_t>();
  p.scales = q.scales.data;
  p.global_scale = q.global_scale.at(0);
  p.block_n = q.block_n;
  p.block_k = q.block_k;
  p.n = q.n;
  p.k = q.k;
  for (int64_t r = 0; r < rows; ++r)
    kernels::cpu::dequant_weight_row(p, int(r), &out[size_t(r * k)]);
  return out;
}

}  // namespace

MlaAttention::MlaAttention(const io::ModelConfig& c, const WeightSource& w, backend::Backend& b,
                           const std::string& prefix, const dist::TpLayout& tp)
    : b_(b), q_lora_rank_(c.mla.q_lora_rank), v_head_dim_(c.mla.v_head_dim) {
  const io::MlaConfig& m = c.mla;
  if (c.attention_bias)
    throw LoadError(
        "config.json: attention_bias with multi-head latent attention is not "
        "supported");
  const dist::Range heads =
      dist::shard_attention(tp, c.num_attention_heads, c.num_attention_heads, 1).q_heads;
  const int H = int(heads.size()), L = m.kv_lora_rank, R = m.qk_rope_head_dim;
  const int nope = m.qk_nope_head_dim, qk = nope + R, kv_b_row = nope + m.v_head_dim;
  const int64_t hidden = c.hidden_size, all_heads = c.num_attention_heads;
  auto scaled = [&](int per_head) {
    return dist::Range{heads.begin * per_head, heads.end * per_head};
  };
  if (q_lora_rank_ > 0) {
    q_a_ = load_linear_sharded(w, b, {{prefix + ".q_a_proj", q_lora_rank_, {0, q_lora_rank_}}},
                               hidden, {0, hidden});
    q_a_norm_ = load_dense(w, b, prefix + ".q_a_layernorm.weight", {q_lora_rank_});
    q_b_ = load_linear_sharded(w, b, {{prefix + ".q_b_proj", all_heads * qk, scaled(qk)}},
                               q_lora_rank_, {0, q_lora_rank_});
  } else {
    q_b_ = load_linear_sharded(w, b, {{prefix + ".q_proj", all_heads * qk, scaled(qk)}}, hidden,
                               {0, hidden});
  }
  kv_a_ = load_linear_sharded(w, b, {{prefix + ".kv_a_proj_with_mqa", L + R, {0, L + R}}}, hidden,
                              {0, hidden});
  kv_norm_ = load_dense(w, b, prefix + ".kv_a_layernorm.weight", {L});
  o_ = load_linear_sharded(w, b, {{prefix + ".o_proj", hidden, {0, hidden}}},
                           all_heads * m.v_head_dim, scaled(m.v_head_dim));
  // kv_b_proj [heads · (nope + v), latent]: per head its key rows (nope), then its value rows.
  // The key rows are folded into the queries, so they are needed transposed: the whole weight is
  // read into host fp32 (dequantized when the checkpoint quantizes it) and kept in the
  // activation dtype.
  const std::vector<float> kv_b_f =
      dequantized_rows(w, prefix + ".kv_b_proj", all_heads * kv_b_row, L);
  Tensor key_t = host_empty(DType::kF32, {H, L, nope});
  Tensor value = host_empty(DType::kF32, {H, m.v_head_dim, L});
  for (int h = 0; h < H; ++h) {
    const float* rows = kv_b_f.data() + size_t(heads.begin + h) * kv_b_row * L;
    float* kt = key_t.as<float>() + size_t(h) * L * nope;
    for (int i = 0; i < nope; ++i)
      for (int j = 0; j < L; ++j) kt[size_t(j) * nope + i] = rows[size_t(i) * L + j];
    std::copy(rows + size_t(nope) * L, rows + size_t(kv_b_row) * L,
              value.as<float>() + size_t(h) * m.v_head_dim * L);
  }
  key_t_ = b.upload_weight(key_t);
  value_ = b.upload_weight(value);

  params_.num_heads = H;
  params_.latent_dim = L;
  params_.rope_dim = R;
  params_.q_stride = qk;
  params_.q_rope_offset = nope;
  params_.scale = c.rope_scaling.mla_softmax_factor / std::sqrt(float(qk));
  params_.rms_norm_eps = kLatentNormEps;
  params_.rope_scale = c.rope_scaling.attention_factor;
  params_.rope_interleaved = m.rope_interleave;
  params_.kv_norm = &kv_norm_;
}

void MlaAttention::forward(const Tensor& x, const backend::StepMetadata& meta,
                           const Tensor& inv_freq, backend::KvCacheLayer& cache, Tensor& out) {
  const DType act = b_.activation_dtype();
  const int64_t T = x.dim(0), H = params_.num_heads, L = params_.latent_dim;
  Tensor q = b_.empty(act, {T, H * params_.q_stride});
  if (q_lora_rank_ > 0) {
    Tensor q_a = b_.empty(act, {T, q_lora_rank_});
    b_.linear(x, q_a_, nullptr, q_a);
    Tensor q_a_normed = b_.empty(act, {T, q_lora_rank_});
    b_.rms_norm(q_a, nullptr, q_a_norm_, kLatentNormEps, q_a_normed);
    b_.linear(q_a_normed, q_b_, nullptr, q);
  } else {
    b_.linear(x, q_b_, nullptr, q);
  }
  Tensor q_lat = b_.empty(act, {T, H * L});
  b_.head_linear(q, params_.q_stride, key_t_, q_lat);
  Tensor kv = b_.empty(act, {T, L + params_.rope_dim});
  b_.linear(x, kv_a_, nullptr, kv);
  Tensor latent_out = b_.empty(act, {T, H * L});
  backend::MlaParams p = params_;
  p.inv_freq = &inv_freq;
  b_.mla_attention(q, q_lat, kv, p, cache, meta, latent_out);
  Tensor values = b_.empty(act, {T, H * v_head_dim_});
  b_.head_linear(latent_out, int(L), value_, values);
  b_.linear(values, o_, nullptr, out);
}

}  // namespace serval::model
