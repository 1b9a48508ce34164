// The output store of the bf16 GEMVs (bf16_gemv.cu, bf16_gemv_bulk.cu): bias added, then
// y[tok, row] as f32 or rounded to bf16 (Bf16GemvParams::y_f32). Included only by .cu files.
#pragma once
#include <cuda_bf16.h>

#include "kernels/cuda/gemm/bf16_gemv.h"

namespace serval::kernels::cuda {

__device__ __forceinline__ void store_gemv_out(const Bf16GemvParams& p, int tok, int row, float v) {
  if (p.bias) v += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[row]);
  const size_t i = size_t(tok) * p.n + row;
  if (p.y_f32) {
    static_cast<float*>(p.y)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(p.y)[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace serval::kernels::cuda
