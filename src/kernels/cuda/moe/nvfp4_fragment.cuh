// NVFP4 → bf16 MMA A-fragment decoding shared by the expert kernels that read the repacked
// layout of moe_nvfp4_repack.h (moe_gemm.cu, moe_gemv_nvfp4.cu). Included only by .cu files.
//
// Scheme: block scales go through a 256-entry table (e4m3 byte → bf16x2 copies of 2⁶⁴·scale);
// dequant_nvfp4 turns a code word into e2m1·scale·2⁻⁶², exact in bf16; the kernels multiply
// their fp32 accumulators by global scale · kNvfp4Unscale (2⁶²) in the epilogue.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/nvfp4_word.h"

namespace serval::kernels::cuda {

// 2⁶² · global scale restores the dequantized weights' 2⁻⁶² (see dequant_nvfp4).
constexpr float kNvfp4Unscale = 0x1p62f;

// e4m3fn byte → float (0x7F / 0xFF NaN).
__device__ __forceinline__ float e4m3_value(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if (e == 15u && m == 7u) {
    v = __int_as_float(0x7fc00000);
  } else if (e == 0u) {
    v = float(m) * 0x1p-9f;
  } else {
    v = ldexpf(1.0f + float(m) * 0.125f, int(e) - 7);
  }
  return (b & 0x80u) ? -v : v;
}

// Fills the 256-entry table e4m3 byte → bf16x2 copies of 2⁶⁴·scale, threads of the CTA striding
// over it. Depends on nothing (may run before the PDL wait); visible after the next barrier.
__device__ __forceinline__ void build_nvfp4_scale_table(uint32_t* lut) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    const __nv_bfloat16 h = __float2bfloat16_rn(e4m3_value(uint32_t(i)) * 0x1p64f);
    const uint32_t bits = __bfloat16_as_ushort(h);
    lut[i] = bits | (bits << 16);
  }
}

// NVFP4 → bf16 fragment. `w` is one word of the repacked layout (moe_nvfp4_repack.h); s_lo and
// s_hi are bf16x2 copies of 2⁶⁴·scale of rows g and g+8. nvfp4_bf16x2_bits gives register j's two
// codes as bf16 e2m1·2⁻¹²⁶ (subnormal for codes ±0.5, ±0, which bf16 fma handles exactly); times
// 2⁶⁴·scale is e2m1·scale·2⁻⁶², an exact bf16 (≤ 6 significant bits, normal range).
__device__ __forceinline__ void dequant_nvfp4(uint32_t (&a)[4], uint32_t w, uint32_t s_lo,
                                              uint32_t s_hi) {
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = bf16x2_mul(nvfp4_bf16x2_bits(w, j), (j & 1) ? s_hi : s_lo);
}

// Block scales of one 16×64 repacked tile, shared within each quad of lanes (t4 = lane & 3):
// `s` holds the tile's scale bytes of rows g and g + 8 (byte 2·kk + h: row g + 8h, k16 step kk),
// the same 8 bytes for the quad's four lanes. Lane t4 looks up step t4's two scales and step kk's
// come from lane kk of the quad by shuffles: 2 table reads per lane and tile instead of 8 (the
// grouped GEMM's tile-8 kernel is instruction-bound at 8 tokens: each read costs a shared load
// and ~2.5 integer ops). The one- and two-token GEMVs keep their own reads (measured: sharing
// costs them 1-4 % at b1 / b2: more registers).
struct QuadScales {
  uint32_t lo, hi;  // bf16x2 copies of 2⁶⁴·scale of rows g and g + 8 at k16 step t4
};

__device__ __forceinline__ QuadScales quad_scales(const uint2& s, int t4, const uint32_t* lut) {
  const uint32_t sb = ((t4 < 2 ? s.x : s.y) >> (16 * (t4 & 1))) & 0xffffu;
  return {lut[sb & 0xffu], lut[sb >> 8]};
}

// dequant_nvfp4 of code word w at k16 step kk with the quad's scales. Whole warp (shuffles).
__device__ __forceinline__ void dequant_nvfp4_step(uint32_t (&a)[4], uint32_t w,
                                                   const QuadScales& q, int kk, int lane) {
  const int src = (lane & ~3) | kk;
  dequant_nvfp4(a, w, __shfl_sync(0xffffffffu, q.lo, src), __shfl_sync(0xffffffffu, q.hi, src));
}

}  // namespace serval::kernels::cuda
