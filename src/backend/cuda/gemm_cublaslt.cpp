#include "backend/cuda/gemm_cublaslt.h"

#include "backend/cuda/cuda_check.h"

namespace serval::backend::cuda {

CublasLtGemm::CublasLtGemm(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  cublas_check(cublasLtCreate(&handle_), "cublasLtCreate");
  cuda_check(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc(cuBLASLt workspace)");
}

CublasLtGemm::~CublasLtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

// Column-major view: yᵀ[n, m] = w[n, k] · xᵀ[k, m], i.e. A = w (stored [k, n] col-major,
// transposed), B = xᵀ (stored [k, m] col-major), C = yᵀ ([n, m] col-major == y row-major).
const CublasLtGemm::Plan& CublasLtGemm::plan(int m, int n, int k, DType y_dtype, bool bias) {
  auto key = std::make_tuple(m, n, k, int(y_dtype), bias);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan p;
  const cudaDataType_t c_type = y_dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  cublas_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                              sizeof(trans_a)),
               "transa");
  cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                              sizeof(trans_b)),
               "transb");
  if (bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cublas_check(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
        "epilogue");
    cudaDataType_t bias_type = CUDA_R_16BF;
    cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)),
                 "bias type");
  }
  cublas_check(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k), "layout a");
  cublas_check(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k), "layout b");
  cublas_check(cublasLtMatrixLayoutCreate(&p.c, c_type, n, m, n), "layout c");
  cublasLtMatmulPreference_t pref;
  cublas_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes_, sizeof(workspace_bytes_)),
               "workspace pref");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublas_check(
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found),
      "heuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) throw Error("cuBLASLt found no algorithm for this GEMM shape");
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void CublasLtGemm::run(const void* x, const void* w, const void* bias, void* y, DType y_dtype,
                       int m, int n, int k, cudaStream_t stream) {
  const Plan& p = plan(m, n, k, y_dtype, bias != nullptr);
  if (bias) {
    cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)),
                 "bias pointer");
  }
  const float alpha = 1.0f, beta = 0.0f;
  cublas_check(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c,
                              &p.algo, workspace_, workspace_bytes_, stream),
               "cublasLtMatmul");
}

}  // namespace serval::backend::cuda
