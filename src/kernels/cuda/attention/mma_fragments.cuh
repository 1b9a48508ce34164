// mma.sync m16n8k16 building blocks shared by the paged attention kernels (decode and prefill):
// cp.async, packed pairs, bf16 → f16 re-encoding, the mma wrapper, ldmatrix (plain and
// transposed), fp8 → f16 conversion and Q fragments.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16/.f16), g = lane / 4, c = lane % 4:
//   A (16×16, row-major): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B (16×8, k × n):      b0 (k = 2c..2c+1, n = g), b1 (k = 2c+8.., n = g)
//   C (16×8, fp32):       c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/misc/cp_async.cuh"

namespace serval::kernels::cuda::attn {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// 2^x (MUFU.EX2, flush-to-zero): ex2(−inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as a packed pair for the mma A operand: .x (low half) = lo.
template <bool kF16>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t r;
  if constexpr (kF16) {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}

// A bf16 pair re-encoded as an f16 pair; magnitudes above the f16 range saturate (NaN stays NaN).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v) {
  float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
  constexpr float kMax = 65504.0f;
  f.x = fabsf(f.x) > kMax ? copysignf(kMax, f.x) : f.x;
  f.y = fabsf(f.y) > kMax ? copysignf(kMax, f.y) : f.y;
  return pack_pair<true>(f.x, f.y);
}

template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8×8 16-bit matrices; lane L supplies the row address of matrix L/8, row L%8, and receives
// row (L/4), elements 2(L%4), 2(L%4)+1 of each matrix.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
// As ldmatrix_x4 with each matrix transposed: lane L receives column L/4, rows 2(L%4), 2(L%4)+1.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// Four fp8 values (element 0 in the low byte of w) as two f16 pairs: lo = elements 0, 1 and
// hi = elements 2, 3, the lower element in the low half. Exact.
template <DType C>
__device__ __forceinline__ void fp8x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (C == DType::kF8E4M3) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xFFFFu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
    lo = uint32_t(a.x) | (uint32_t(a.y) << 16);
    hi = uint32_t(b.x) | (uint32_t(b.y) << 16);
  } else {
    static_assert(C == DType::kF8E5M2);
    // An e5m2 byte is the high byte of the f16 with the same value (same sign, exponent bias 15,
    // mantissa truncated to 2 bits): byte i goes to bits 8..15 of half i, zeros below.
    lo = __byte_perm(w, 0u, 0x1404);
    hi = __byte_perm(w, 0u, 0x3424);
  }
}

// Eight fp8 values at `src` (shared memory, 8-byte aligned) stored as eight f16 at shared address
// `dst` (16-byte aligned): one 8-byte load, one 16-byte store. Exact.
template <DType C>
__device__ __forceinline__ void fp8x8_to_f16_shared(uint32_t dst, const unsigned char* src) {
  const uint2 raw = *reinterpret_cast<const uint2*>(src);
  uint32_t h0, h1, h2, h3;
  fp8x4_to_f16x4<C>(raw.x, h0, h1);
  fp8x4_to_f16x4<C>(raw.y, h2, h3);
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(h0), "r"(h1), "r"(h2),
               "r"(h3)
               : "memory");
}

// A fragments of 16 query rows (bf16 in global memory, re-encoded as f16 when kF16); a null row
// pointer gives a zero row.
template <int D, bool kF16>
__device__ __forceinline__ void load_q_frags(uint32_t (&qa)[D / 16][4], const __nv_bfloat16* lo,
                                             const __nv_bfloat16* hi, int c) {
  auto ld = [](const __nv_bfloat16* p) {
    const uint32_t v = *reinterpret_cast<const uint32_t*>(p);
    if constexpr (kF16) {
      return bf16x2_to_f16x2(v);
    } else {
      return v;
    }
  };
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int col = kk * 16 + 2 * c;
    qa[kk][0] = lo ? ld(lo + col) : 0u;
    qa[kk][1] = hi ? ld(hi + col) : 0u;
    qa[kk][2] = lo ? ld(lo + col + 8) : 0u;
    qa[kk][3] = hi ? ld(hi + col + 8) : 0u;
  }
}

}  // namespace serval::kernels::cuda::attn
