// Row-major GEMMs y[m, n] = x[m, k] · w[n, k]ᵀ through cuBLASLt, with the algorithm chosen once
// per shape (heuristic, cached).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>
#include <tuple>

#include "base/dtype.h"

namespace serval::backend::cuda {

class CublasLtGemm {
 public:
  explicit CublasLtGemm(size_t workspace_bytes = 32u << 20);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // x: [m, k] bf16; w: [n, k] bf16; y: [m, n] in y_dtype (bf16 or f32); bias: [n] bf16 or null.
  // fp32 accumulation.
  void run(const void* x, const void* w, const void* bias, void* y, DType y_dtype, int m, int n,
           int k, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(int m, int n, int k, DType y_dtype, bool bias);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_;
  std::map<std::tuple<int, int, int, int, bool>, Plan> plans_;
};

}  // namespace serval::backend::cuda
