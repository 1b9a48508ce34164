// y = x · Wᵀ on the CPU: parallel over output features; each weight row is converted to fp32
// once and reused for every input row, so bf16/f16 weights cost one pass.
#include <algorithm>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"

namespace serval::kernels::cpu {

void linear(const LinearParams& p) {
  const size_t row_bytes = size_t(p.k) * dtype_bits(p.w_dtype) / 8;
  std::vector<float> bias;
  if (p.bias) {
    bias.resize(p.n);
    to_float(p.bias, p.w_dtype, bias.data(), p.n);
  }
  ThreadPool::global().parallel_for(p.n, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> w_row(p.w_dtype == DType::kF32 ? 0 : p.k);
    for (int64_t n = begin; n < end; ++n) {
      const char* src = static_cast<const char*>(p.w) + size_t(n) * row_bytes;
      const float* w = reinterpret_cast<const float*>(src);
      if (p.w_dtype != DType::kF32) {
        to_float(src, p.w_dtype, w_row.data(), p.k);
        w = w_row.data();
      }
      float b = p.bias ? bias[n] : 0.0f;
      for (int m = 0; m < p.m; ++m)
        p.y[size_t(m) * p.n + n] = dot(p.x + size_t(m) * p.k, w, p.k) + b;
    }
  });
}

}  // namespace serval::kernels::cpu
