// Shared helpers of the GPU kernel tests (the `kernels_gpu` binary).
#pragma once
#include <cuda_runtime_api.h>

#include "backend/communicator.h"

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

// gpu_count() for a test whose GPUs wait on each other in collectives: as its process's first
// CUDA call, it makes kernel loading eager first (backend::prefer_eager_cuda_module_loading).
inline int gpu_count_for_collectives() {
  backend::prefer_eager_cuda_module_loading();
  return gpu_count();
}

}  // namespace serval::testing
