#include "kernels/cpu/quant_linear.h"

#include <array>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"
#include "kernels/nvfp4_layout.h"

namespace serval::kernels::cpu {

namespace {

// Decode tables, built once: every e4m3 byte and every e2m1 nibble as float.
struct Tables {
  std::array<float, 256> e4m3;
  std::array<float, 16> e2m1;
  Tables() {
    for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_float(uint8_t(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_value(uint32_t(i));
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

void dequant_weight_row(const QuantLinearParams& p, int row, float* out) {
  const Tables& t = tables();
  const size_t r = size_t(row);
  switch (p.format) {
    case WeightFormat::kNvfp4: {
      const uint8_t* q = p.w + r * (p.k / 2);
      const uint8_t* sf = static_cast<const uint8_t*>(p.scales) + r * (p.k / 16);
      for (int b = 0; b < p.k / 16; ++b) {
        const float s = t.e4m3[sf[b]];
        for (int j = 0; j < 8; ++j) {
          const uint8_t byte = q[b * 8 + j];
          out[b * 16 + 2 * j] = (t.e2m1[byte & 0xf] * s) * p.global_scale;
          out[b * 16 + 2 * j + 1] = (t.e2m1[byte >> 4] * s) * p.global_scale;
        }
      }
      return;
    }
    case WeightFormat::kFp8PerTensor:
    case WeightFormat::kFp8PerChannel: {
      const uint8_t* q = p.w + r * p.k;
      const float s = p.format == WeightFormat::kFp8PerTensor
                          ? p.global_scale
                          : static_cast<const float*>(p.scales)[r];
      for (int c = 0; c < p.k; ++c) out[c] = t.e4m3[q[c]] * s;
      return;
    }
    case WeightFormat::kFp8Block: {
      const uint8_t* q = p.w + r * p.k;
      const int blocks_k = (p.k + p.block_k - 1) / p.block_k;
      const float* s = static_cast<const float*>(p.scales) + size_t(row / p.block_n) * blocks_k;
      for (int c = 0; c < p.k; ++c) out[c] = t.e4m3[q[c]] * s[c / p.block_k];
      return;
    }
  }
}

void quant_linear(const QuantLinearParams& p) {
  if (p.format == WeightFormat::kNvfp4 && p.k % 16 != 0)
    throw InvalidArgument("quant_linear: NVFP4 needs k % 16 == 0, got k = " + std::to_string(p.k));
  if (p.format == WeightFormat::kFp8Block && (p.block_n <= 0 || p.block_k <= 0))
    throw InvalidArgument("quant_linear: FP8 block sizes must be positive");
  std::vector<float> bias;
  if (p.bias) {
    bias.resize(p.n);
    to_float(p.bias, p.bias_dtype, bias.data(), p.n);
  }
  ThreadPool::global().parallel_for(p.n, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> w(p.k);
    for (int64_t n = begin; n < end; ++n) {
      dequant_weight_row(p, int(n), w.data());
      const float b = p.bias ? bias[n] : 0.0f;
      for (int m = 0; m < p.m; ++m)
        p.y[size_t(m) * p.n + n] = dot(p.x + size_t(m) * p.k, w.data(), p.k) + b;
    }
  });
}

}  // namespace serval::kernels::cpu
