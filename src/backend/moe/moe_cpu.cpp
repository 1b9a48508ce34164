#include "backend/moe/moe_cpu.h"

#include <cstring>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

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

void moe_forward_cpu(const float* x, int num_tokens, const MoeWeights& w, float* out) {
  const int H = w.hidden, I = w.inter;
  std::vector<float> logits(size_t(num_tokens) * w.num_experts);
  kernels::cpu::linear(
      {x, w.router.data, w.router.dtype, nullptr, logits.data(), num_tokens, w.num_experts, H});
  Dispatch d = dispatch(logits.data(), num_tokens, w);
  std::memset(out, 0, sizeof(float) * size_t(num_tokens) * H);

  const size_t elem_bits = dtype_bits(w.gate_up.dtype);
  for (int e = 0; e < w.num_local; ++e) {
    int begin = d.offsets[e], count = d.offsets[e + 1] - begin;
    if (count == 0) continue;
    std::vector<float> xs(size_t(count) * H), h(size_t(count) * 2 * I), act(size_t(count) * I),
        y(size_t(count) * H);
    for (int i = 0; i < count; ++i)
      std::memcpy(&xs[size_t(i) * H], x + size_t(d.token[begin + i]) * H, sizeof(float) * H);
    const char* gate_up =
        static_cast<const char*>(w.gate_up.data) + size_t(e) * 2 * I * H * elem_bits / 8;
    const char* down = static_cast<const char*>(w.down.data) + size_t(e) * H * I * elem_bits / 8;
    kernels::cpu::linear({xs.data(), gate_up, w.gate_up.dtype, nullptr, h.data(), count, 2 * I, H});
    kernels::cpu::silu_mul({h.data(), act.data(), count, I});
    kernels::cpu::linear({act.data(), down, w.down.dtype, nullptr, y.data(), count, H, I});
    for (int i = 0; i < count; ++i) {
      float* dst = out + size_t(d.token[begin + i]) * H;
      const float wt = d.weight[begin + i];
      for (int c = 0; c < H; ++c) dst[c] += wt * y[size_t(i) * H + c];
    }
  }
}

}  // namespace serval::backend::moe
