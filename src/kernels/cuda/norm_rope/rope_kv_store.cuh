// Device helpers shared by the two writers of RoPE'd q and the paged KV cache: qk_norm_rope_kv
// (its own kernel) and the q/k/v decode GEMV's epilogue (quant_gemv_rope_kv). Both must give the
// same bits for the same inputs, so the rotation and the cache casts live here once.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// Neox RoPE of the pair (x1, x2) = dims (i, i + D/2) at angle pos · freq (fp32, sincosf):
// y1 = x1·cos − x2·sin, y2 = x2·cos + x1·sin, each product and sum rounded on its own (no FMA
// contraction, as the CPU twin computes it).
__device__ __forceinline__ void rope_rotate(float x1, float x2, float pos, float freq, float& y1,
                                            float& y2) {
  float s, c;
  sincosf(pos * freq, &s, &c);
  y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// Stores a → row[i] and b → row[j] in the cache type C (round to nearest even; fp8 saturates to
// the largest finite value: cvt.rn.satfinite).
template <DType C>
__device__ __forceinline__ void cache_store_pair(void* row, int i, int j, float a, float b) {
  if constexpr (C == DType::kBF16) {
    auto* p = static_cast<__nv_bfloat16*>(row);
    p[i] = __float2bfloat16(a);
    p[j] = __float2bfloat16(b);
  } else {
    constexpr __nv_fp8_interpretation_t kFormat = C == DType::kF8E4M3 ? __NV_E4M3 : __NV_E5M2;
    const __nv_fp8x2_storage_t two =
        __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFormat);  // a: low byte
    auto* p = static_cast<uint8_t*>(row);
    p[i] = uint8_t(two & 0xFFu);
    p[j] = uint8_t(two >> 8);
  }
}

// Stores a → row[i] in the cache type C, with the same conversion as cache_store_pair.
template <DType C>
__device__ __forceinline__ void cache_store_one(void* row, int i, float a) {
  if constexpr (C == DType::kBF16) {
    static_cast<__nv_bfloat16*>(row)[i] = __float2bfloat16(a);
  } else {
    constexpr __nv_fp8_interpretation_t kFormat = C == DType::kF8E4M3 ? __NV_E4M3 : __NV_E5M2;
    const __nv_fp8x2_storage_t two =
        __nv_cvt_float2_to_fp8x2(make_float2(a, 0.0f), __NV_SATFINITE, kFormat);
    static_cast<uint8_t*>(row)[i] = uint8_t(two & 0xFFu);
  }
}

}  // namespace serval::kernels::cuda
