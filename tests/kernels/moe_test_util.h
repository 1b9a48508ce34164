// Helpers of the MoE GPU tests: device buffers, a fixed-seed generator, error norms.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace serval::testing::moe_util {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Owning device allocation.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    cuda_ok(cudaMalloc(&ptr_, bytes ? bytes : 1), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  template <typename T>
  void upload(const std::vector<T>& v) {
    cuda_ok(cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  template <typename T>
  std::vector<T> download(size_t n) const {
    std::vector<T> v(n);
    cuda_ok(cudaMemcpy(v.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  void poison() { cuda_ok(cudaMemset(ptr_, 0xFF, bytes_), "poison"); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// xorshift64*: fast, fixed-seed, good enough for test data.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint32_t next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return uint32_t((s_ * 0x2545F4914F6CDD1Dull) >> 32);
  }
  float uniform() { return float(next()) * (2.0f / 4294967296.0f) - 1.0f; }  // [-1, 1)
  float normal() {  // Irwin–Hall approximation: mean 0, variance 1
    float s = 0;
    for (int i = 0; i < 12; ++i) s += float(next()) * (1.0f / 4294967296.0f);
    return s - 6.0f;
  }

 private:
  uint64_t s_;
};

// Random bf16 values uniform in [-scale, scale).
inline std::vector<bf16> random_bf16(size_t n, float scale, Rng& rng) {
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(scale * rng.uniform());
  return v;
}

inline std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  return f;
}

// ‖a − b‖₂ / ‖b‖₂ (b the reference).
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1e-30));
}

}  // namespace serval::testing::moe_util
