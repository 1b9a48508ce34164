// Row-wise CPU kernels: embedding, RMSNorm, SiLU-and-mul, rotary embedding, conversions.
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace serval::kernels::cpu {

void to_float(const void* src, DType dtype, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u = uint32_t(s[i]) << 16;
        std::memcpy(&dst[i], &u, 4);
      }
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_as_float(src, dtype, size_t(i));
  }
}

void embedding(const EmbeddingParams& p) {
  const size_t row_bytes = size_t(p.hidden) * dtype_bits(p.table_dtype) / 8;
  for (int t = 0; t < p.num_tokens; ++t) {
    int32_t id = p.ids[t];
    if (id < 0 || id >= p.vocab) {
      throw InvalidArgument("token id " + std::to_string(id) + " outside the vocabulary (size " +
                            std::to_string(p.vocab) + ")");
    }
    const char* row = static_cast<const char*>(p.table) + size_t(id) * row_bytes;
    to_float(row, p.table_dtype, p.out + size_t(t) * p.hidden, p.hidden);
  }
}

void rms_norm(const RmsNormParams& p) {
  std::vector<float> w(p.hidden);
  to_float(p.weight, p.weight_dtype, w.data(), p.hidden);
  ThreadPool::global().parallel_for(p.rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = p.x + r * p.hidden;
      float* out = p.out + r * p.hidden;
      const float* src = x;
      if (p.residual) {
        float* res = p.residual + r * p.hidden;
        for (int i = 0; i < p.hidden; ++i) res[i] += x[i];
        src = res;
      }
      double sum_sq = 0;
      for (int i = 0; i < p.hidden; ++i) sum_sq += double(src[i]) * src[i];
      float inv = 1.0f / std::sqrt(float(sum_sq / p.hidden) + p.eps);
      for (int i = 0; i < p.hidden; ++i) out[i] = src[i] * inv * w[i];
    }
  });
}

void silu_mul(const SiluMulParams& p) {
  ThreadPool::global().parallel_for(p.rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = p.x + r * 2 * p.inter;
      const float* up = gate + p.inter;
      float* out = p.out + r * p.inter;
      for (int i = 0; i < p.inter; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    }
  });
}

void sigmoid_gate_add(const SigmoidGateAddParams& p) {
  ThreadPool::global().parallel_for(p.rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float g = 1.0f / (1.0f + std::exp(-p.gate[r]));
      const float* x = p.x + r * p.cols;
      float* out = p.out + r * p.cols;
      for (int i = 0; i < p.cols; ++i) out[i] += g * x[i];
    }
  });
}

namespace {

void rotate(float* head, const float* cos, const float* sin, int half) {
  for (int i = 0; i < half; ++i) {
    float x1 = head[i], x2 = head[i + half];
    head[i] = x1 * cos[i] - x2 * sin[i];
    head[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace

void rope(const RopeParams& p) {
  const int half = p.head_dim / 2;
  ThreadPool::global().parallel_for(p.num_tokens, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> cos(half), sin(half);
    for (int64_t t = begin; t < end; ++t) {
      for (int i = 0; i < half; ++i) {
        float angle = float(p.positions[t]) * p.inv_freq[i];
        cos[i] = std::cos(angle);
        sin[i] = std::sin(angle);
      }
      for (int h = 0; h < p.num_q_heads; ++h)
        rotate(p.q + (t * p.num_q_heads + h) * p.head_dim, cos.data(), sin.data(), half);
      for (int h = 0; h < p.num_kv_heads; ++h)
        rotate(p.k + (t * p.num_kv_heads + h) * p.head_dim, cos.data(), sin.data(), half);
    }
  });
}

}  // namespace serval::kernels::cpu
