#include "backend/moe/moe_cpu.h"

#include <cstring>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/nvfp4_quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_linear.h"

namespace serval::backend::moe {

Dispatch dispatch(const float* router_logits, int num_tokens, const MoeWeights& w) {
  std::vector<int32_t> ids(size_t(num_tokens) * w.top_k);
  std::vector<float> weights(ids.size());
  kernels::RouterParams rp{};
  rp.logits = router_logits;
  rp.topk_ids = ids.data();
  rp.topk_weights = weights.data();
  rp.num_tokens = num_tokens;
  rp.num_experts = w.num_experts;
  rp.top_k = w.top_k;
  rp.method = w.routing;
  rp.renormalize = w.renormalize;
  rp.correction_bias = w.correction_bias.data ? w.correction_bias.as<float>() : nullptr;
  rp.num_groups = w.num_groups;
  rp.topk_groups = w.topk_groups;
  rp.routed_scaling_factor = w.routed_scaling_factor;
  kernels::cpu::route(rp);

  Dispatch d;
  d.offsets.assign(w.num_local + 1, 0);
  for (int32_t e : ids) {
    int local = e - w.local_offset;
    if (local >= 0 && local < w.num_local) ++d.offsets[local + 1];
  }
  for (int e = 0; e < w.num_local; ++e) d.offsets[e + 1] += d.offsets[e];
  d.token.resize(d.offsets.back());
  d.weight.resize(d.offsets.back());
  std::vector<int32_t> fill(d.offsets.begin(), d.offsets.end() - 1);
  for (int t = 0; t < num_tokens; ++t) {
    for (int j = 0; j < w.top_k; ++j) {
      int local = ids[size_t(t) * w.top_k + j] - w.local_offset;
      if (local < 0 || local >= w.num_local) continue;
      int slot = fill[local]++;
      d.token[slot] = t;
      d.weight[slot] = weights[size_t(t) * w.top_k + j];
    }
  }
  return d;
}

namespace {

// y[m, rows] = x[m, cols] · W_eᵀ for local expert e of `dense` ([E, rows, cols]) or, when set,
// of the quantized stack `q`.
void expert_linear(const Tensor& dense, const std::optional<QuantizedWeight>& q, int e,
                   const float* x, int m, int rows, int cols, float* y) {
  if (!q) {
    const size_t bytes = size_t(rows) * cols * dtype_bits(dense.dtype) / 8;
    kernels::cpu::linear({x, static_cast<const char*>(dense.data) + size_t(e) * bytes, dense.dtype,
                          nullptr, y, m, rows, cols});
    return;
  }
  kernels::QuantLinearParams p{};
  p.x = x;
  std::vector<float> xq;
  if (q->quantize_activations) {  // W4A4: this expert's input scale
    xq.resize(size_t(m) * cols);
    kernels::cpu::nvfp4_fake_quant_rows(x, m, cols, 1.0f / q->input_scale.at(size_t(e)), xq.data());
    p.x = xq.data();
  }
  p.format = q->format;
  p.w = q->data.as<const uint8_t>() + size_t(e) * q->data_bytes();
  p.scales = q->scales.data
                 ? static_cast<const char*>(q->scales.data) + size_t(e) * q->scale_bytes()
                 : nullptr;
  p.global_scale = q->global_scale.at(size_t(e));
  p.block_n = q->block_n;
  p.block_k = q->block_k;
  p.y = y;
  p.m = m;
  p.n = rows;
  p.k = cols;
  kernels::cpu::quant_linear(p);
}

}  // namespace

void moe_forward_cpu(const float* x, int num_tokens, const MoeWeights& w, float* out) {
  const int H = w.hidden, I = w.inter;
  std::vector<float> logits(size_t(num_tokens) * w.num_experts);
  kernels::cpu::linear(
      {x, w.router.data, w.router.dtype, nullptr, logits.data(), num_tokens, w.num_experts, H});
  Dispatch d = dispatch(logits.data(), num_tokens, w);
  std::memset(out, 0, sizeof(float) * size_t(num_tokens) * H);

  for (int e = 0; e < w.num_local; ++e) {
    int begin = d.offsets[e], count = d.offsets[e + 1] - begin;
    if (count == 0) continue;
    std::vector<float> xs(size_t(count) * H), h(size_t(count) * 2 * I), act(size_t(count) * I),
        y(size_t(count) * H);
    for (int i = 0; i < count; ++i)
      std::memcpy(&xs[size_t(i) * H], x + size_t(d.token[begin + i]) * H, sizeof(float) * H);
    expert_linear(w.gate_up, w.gate_up_q, e, xs.data(), count, 2 * I, H, h.data());
    kernels::cpu::silu_mul({h.data(), act.data(), count, I});
    expert_linear(w.down, w.down_q, e, act.data(), count, H, I, y.data());
    for (int i = 0; i < count; ++i) {
      float* dst = out + size_t(d.token[begin + i]) * H;
      const float wt = d.weight[begin + i];
      for (int c = 0; c < H; ++c) dst[c] += wt * y[size_t(i) * H + c];
    }
  }
}

}  // namespace serval::backend::moe
