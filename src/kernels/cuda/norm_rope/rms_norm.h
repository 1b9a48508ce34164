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

}  // namespace serval::kernels::cuda
