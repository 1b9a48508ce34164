// Helpers of the bf16 GPU kernel tests: device buffers, seeded random bf16 data, rel L2 error.
#pragma once
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace serval::testing {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// The work `enqueue` puts on `stream`, captured once as a CUDA graph and instantiated; launch()
// replays it. Throws std::runtime_error naming the failing step.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, const std::function<void(cudaStream_t)>& enqueue,
                cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
    cuda_check(cudaStreamBeginCapture(stream, mode), "begin capture");
    try {
      enqueue(stream);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream, &broken);
      if (broken) (void)cudaGraphDestroy(broken);
      throw;
    }
    cuda_check(cudaStreamEndCapture(stream, &graph_), "end capture");
    cuda_check(cudaGraphInstantiate(&exec_, graph_, 0), "instantiate graph");
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    if (graph_) (void)cudaGraphDestroy(graph_);
  }
  void launch(cudaStream_t stream) const {
    cuda_check(cudaGraphLaunch(exec_, stream), "launch graph");
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Owns n elements of T in device memory.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&ptr_), (n ? n : 1) * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  // upload and poison run on the legacy stream, which kernels on non-blocking streams do not
  // wait for (and a pageable cudaMemcpy may return before its DMA lands): both fence the whole
  // device on each side, so that the next launch on any stream sees the new bytes.
  void upload(const std::vector<T>& host) {
    cuda_check(cudaDeviceSynchronize(), "before upload");
    cuda_check(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaDeviceSynchronize(), "upload");
  }
  std::vector<T> download() const {
    cuda_check(cudaDeviceSynchronize(), "kernel");
    std::vector<T> host(n_);
    cuda_check(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
  // 0xFF bytes: NaN in bf16 and f32, so unwritten outputs cannot pass a comparison.
  void poison() {
    cuda_check(cudaDeviceSynchronize(), "before poison");
    cuda_check(cudaMemset(ptr_, 0xFF, n_ * sizeof(T)), "poison");
    cuda_check(cudaDeviceSynchronize(), "poison");
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// Uniform values in [lo, hi), rounded to bf16; never all zeros.
inline std::vector<bf16> random_bf16(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(dist(rng));
  return v;
}

inline std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  return f;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
  return b;
}

// ||got − want|| / ||want||; NaN/inf anywhere in `got` gives +inf.
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-30));
}

inline double rel_l2(const std::vector<bf16>& got, const std::vector<float>& want) {
  return rel_l2(to_float(got), want);
}

}  // namespace serval::testing
