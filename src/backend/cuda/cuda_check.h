// Error checks for CUDA runtime and cuBLASLt calls: failures become serval::Error with context.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "base/error.h"

namespace serval::backend::cuda {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

inline void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLASLt error in ") + what + ": status " + std::to_string(int(s)));
}

}  // namespace serval::backend::cuda
