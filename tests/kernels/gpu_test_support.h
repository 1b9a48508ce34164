// Shared helpers of the GPU kernel tests (the `kernels_gpu` binary).
#pragma once
#include <cuda_runtime_api.h>

namespace serval::testing {

// True when a CUDA device is present; tests call GTEST_SKIP() otherwise.
inline bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Number of CUDA devices (0 without a driver or GPU).
inline int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace serval::testing
