#include "backend/cuda/gemm_cublaslt.h"

#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_tuning.h"
#include "base/first_use_fence.h"
#include "base/log.h"

namespace serval::backend::cuda {

namespace {

bool tuning_enabled() {
  const char* env = std::getenv("SERVAL_GEMM_TUNE");
  return env == nullptr || std::string(env) != "0";
}

}  // namespace

CublasLtGemm::CublasLtGemm(size_t workspace_bytes)
    : workspace_bytes_(workspace_bytes), tuning_(tuning_enabled()) {
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
CublasLtGemm::Plan& CublasLtGemm::plan(int m, int n, int k, DType y_dtype, bool bias) {
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
  const bool tune = tuning_ && gemm_worth_tuning(m, n, k);
  cublasLtMatmulHeuristicResult_t results[kGemmTuneCandidates] = {};
  int found = 0;
  cublas_check(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref,
                                              tune ? kGemmTuneCandidates : 1, results, &found),
               "heuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) throw Error("cuBLASLt found no algorithm for this GEMM shape");
  p.algo = results[0].algo;
  if (tune && found > 1)
    for (int i = 0; i < found; ++i) p.candidates.push_back(results[i].algo);
  return plans_.emplace(key, p).first->second;
}

void CublasLtGemm::tune(Plan& p, const BucketKey& bucket, const void* x, const void* w, void* y,
                        cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  auto fits = [&](const cublasLtMatmulAlgo_t& algo) {
    cublasLtMatmulHeuristicResult_t check{};
    return cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.c, p.c, &algo, &check) ==
               CUBLAS_STATUS_SUCCESS &&
           check.workspaceSize <= workspace_bytes_;
  };
  if (auto it = tuned_.find(bucket); it != tuned_.end()) {
    if (fits(it->second)) p.algo = it->second;
    p.candidates.clear();
    return;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> median_ms;
  for (const cublasLtMatmulAlgo_t& algo : p.candidates) {
    std::vector<float> ms;
    for (int i = 0; i < kGemmTuneWarmups + kGemmTuneRuns; ++i) {
      cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
      const cublasStatus_t st =
          cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &algo,
                         workspace_, workspace_bytes_, stream);
      cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
      cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      if (st != CUBLAS_STATUS_SUCCESS) {
        ms.clear();
        break;
      }
      float t = 0.0f;
      cuda_check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      if (i >= kGemmTuneWarmups) ms.push_back(t);
    }
    median_ms.push_back(ms.empty() ? -1.0f : gemm_tune_median(ms));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const int best = gemm_fastest(median_ms);
  if (best >= 0) {
    p.algo = p.candidates[size_t(best)];
    tuned_.emplace(bucket, p.algo);
    log::debug(
        "cuBLASLt GEMM m <= {} n {} k {}: candidate {} of {} ({:.3f} ms; heuristic's {:.3f} ms)",
        std::get<0>(bucket), std::get<1>(bucket), std::get<2>(bucket), best, median_ms.size(),
        median_ms[size_t(best)], median_ms[0]);
  }
  p.candidates.clear();
}

void CublasLtGemm::run(const void* x, const void* w, const void* bias, void* y, DType y_dtype,
                       int m, int n, int k, cudaStream_t stream) {
  auto is_eager = [stream] {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
    return status == cudaStreamCaptureStatusNone;
  };
  // An eager run that may load kernels (gemm_run_may_load: a new shape, or one planned during a
  // capture and still to be timed) runs inside the thread's first-use fence
  // (base/first_use_fence.h). Only those runs ask whether the stream is capturing.
  const auto found = plans_.find({m, n, k, int(y_dtype), bias != nullptr});
  const bool planned = found != plans_.end();
  const bool first_use =
      gemm_run_may_load(planned, planned && !found->second.candidates.empty()) && is_eager();
  FirstUseFence* fence = first_use ? thread_first_use_fence() : nullptr;
  if (fence) fence->before();
  Plan& p = planned ? found->second : plan(m, n, k, y_dtype, bias != nullptr);
  if (bias) {
    cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)),
                 "bias pointer");
  }
  // Timing needs an eager stream; a capture keeps the heuristic's choice for now.
  if (!p.candidates.empty() && first_use)
    tune(p, {gemm_tune_bucket(m), n, k, int(y_dtype), bias != nullptr}, x, w, y, stream);
  const float alpha = 1.0f, beta = 0.0f;
  cublas_check(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c,
                              &p.algo, workspace_, workspace_bytes_, stream),
               "cublasLtMatmul");
  if (fence) fence->after();
}

}  // namespace serval::backend::cuda
