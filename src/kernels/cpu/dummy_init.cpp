#include "kernels/cpu/dummy_init.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/dummy_random.h"

namespace serval::kernels::cpu {

namespace {

// Calls set(i, u) for i in [0, n), u = dummy_uniform(key, counter(i)), in parallel.
template <typename Counter, typename Set>
void fill(int64_t n, uint64_t key, Counter counter, Set set) {
  ThreadPool::global().parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) set(i, dummy_uniform(key, uint64_t(counter(i))));
  });
}

}  // namespace

void dummy_dense(void* out, DType dtype, int64_t rows, int64_t cols, uint64_t key, int64_t offset,
                 int64_t row_stride, float center, float half_width) {
  if (rows <= 0 || cols <= 0) return;
  auto counter = [&](int64_t i) { return offset + (i / cols) * row_stride + i % cols; };
  auto value = [&](float u) { return center + (2.0f * u - 1.0f) * half_width; };
  switch (dtype) {
    case DType::kF32:
      fill(rows * cols, key, counter,
           [&](int64_t i, float u) { static_cast<float*>(out)[i] = value(u); });
      return;
    case DType::kBF16:
      fill(rows * cols, key, counter,
           [&](int64_t i, float u) { static_cast<bf16*>(out)[i] = float_to_bf16(value(u)); });
      return;
    case DType::kF16:
      fill(rows * cols, key, counter,
           [&](int64_t i, float u) { static_cast<f16*>(out)[i] = float_to_f16(value(u)); });
      return;
    default:
      throw Error("dummy weights: unsupported dtype " + std::string(dtype_name(dtype)));
  }
}

void dummy_bits(uint8_t* out, int64_t n, uint64_t key) {
  const int64_t words = (n + 7) / 8;
  ThreadPool::global().parallel_for(words, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const uint64_t bits = splitmix64(key + uint64_t(w));
      const int64_t base = w * 8, count = std::min<int64_t>(8, n - base);
      std::memcpy(out + base, &bits, size_t(count));
    }
  });
}

void dummy_fp8(uint8_t* out, int64_t n, uint64_t key, float half_width) {
  fill(
      n, key, [](int64_t i) { return i; },
      [&](int64_t i, float u) { out[i] = float_to_e4m3((2.0f * u - 1.0f) * half_width); });
}

void dummy_codes(uint8_t* out, int64_t n, uint64_t key, uint8_t lo, uint8_t hi) {
  fill(
      n, key, [](int64_t i) { return i; },
      [&](int64_t i, float u) { out[i] = dummy_code(u, lo, hi); });
}

}  // namespace serval::kernels::cpu
