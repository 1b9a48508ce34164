// Fused (residual add +) RMSNorm on bf16 rows, fp32 math inside.
#pragma once
#include <cuda_runtime_api.h>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// With `residual` non-null: residual = bf16(residual + x) (sum in fp32), then
// out = norm(residual) · weight — vLLM's fused_add_rms_norm. Without: out = norm(x) · weight.
// `out` may alias `x`. hidden must be a multiple of 8 and all pointers 16-byte aligned.
struct RmsNormParams {
  const bf16* x;       // [rows, hidden]
  bf16* residual;      // [rows, hidden] or null
  const bf16* weight;  // [hidden]
  bf16* out;           // [rows, hidden]
  int rows, hidden;
  float eps;
};

void rms_norm(const RmsNormParams& p, cudaStream_t stream);

// The CTA rms_norm runs a row with (hidden % 8 == 0): `threads` threads, each owning the 8-element
// vectors tid + i·threads for i < vecs; vecs ≤ 4 (hidden ≤ 8192) keeps them in registers, larger
// rows take two passes. The sum of squares, and so the result, depends on this shape: a kernel
// that fuses the norm (moe_finalize's) emulates it.
inline constexpr int kRmsNormMaxThreads = 256;
struct RmsNormCta {
  int threads, vecs;
};
constexpr RmsNormCta rms_norm_cta(int hidden) {
  const int vecs = hidden / 8;
  int threads = (vecs + 31) / 32 * 32;  // one vector per thread up to 256 threads
  threads = threads < 32 ? 32 : threads > kRmsNormMaxThreads ? kRmsNormMaxThreads : threads;
  return {threads, (vecs + threads - 1) / threads};
}

}  // namespace serval::kernels::cuda
