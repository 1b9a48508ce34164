// Row-major GEMMs y[m, n] = x[m, k] · w[n, k]ᵀ through cuBLASLt, with the algorithm chosen once
// per shape and cached: cuBLASLt's heuristic for small GEMMs; large ones (prefill) are timed at
// their first eager use among the heuristic's first candidates, once per m bucket
// (gemm_tuning.h). SERVAL_GEMM_TUNE=0 keeps the heuristic's choice everywhere.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>
#include <tuple>
#include <vector>

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
    std::vector<cublasLtMatmulAlgo_t> candidates;  // heuristic order; emptied once settled
  };
  using BucketKey = std::tuple<int, int, int, int, bool>;  // m bucket, n, k, y dtype, bias
  Plan& plan(int m, int n, int k, DType y_dtype, bool bias);
  // Settles p.algo for this m: the bucket's tuned algorithm where it fits this m's layouts, else
  // the fastest of p.candidates timed on these operands (stream must not be capturing).
  void tune(Plan& p, const BucketKey& bucket, const void* x, const void* w, void* y,
            cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_;
  std::map<std::tuple<int, int, int, int, bool>, Plan> plans_;
  std::map<BucketKey, cublasLtMatmulAlgo_t> tuned_;
  const bool tuning_;  // SERVAL_GEMM_TUNE != 0
};

}  // namespace serval::backend::cuda
