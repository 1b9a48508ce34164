// The decode kernel's mma fragments straight from staged fp8 KV rows (paged_decode.cu): fp8 → f16
// conversions, Q·Kᵀ scores, P·V accumulation, and the permuted head dims of the accumulators. See
// paged_decode.cu's first comment for the scheme.
#pragma once
#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/decode_shape.cuh"

namespace serval::kernels::cuda::decode {

using namespace attn;

// Two e4m3 / e5m2 values (element 0 in the low byte) as an f16 pair, element 0 in the low half.
template <DType C>
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t pair) {
  if constexpr (C == DType::kF8E4M3) {
    uint32_t r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(uint16_t(pair)));
    return r;
  } else {
    static_assert(C == DType::kF8E5M2);
    return __byte_perm(pair, 0u, 0x1404);  // e5m2 = high byte of the equal f16
  }
}

// s[j] = Q · K[8j .. 8j+7]ᵀ from the staged fp8 key rows at `sk` (row stride D + 16 bytes).
template <int D, DType C>
__device__ __forceinline__ void qk_scores_fp8(float (&s)[2][4], const uint32_t (&qa)[D / 16][4],
                                              const unsigned char* sk, int g, int c) {
  constexpr int kRowBytes = DecodeShape<D, C>::kRowBytes;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const unsigned char* row = sk + (8 * j + g) * kRowBytes + 4 * c;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(row + kk * 16);
      mma_16816<true>(s[j], qa[kk], fp8x2_to_f16x2<C>(w), fp8x2_to_f16x2<C>(w >> 16));
    }
  }
}

// From r = bytes (key k, dim d), (k, d+1), (k+1, d), (k+1, d+1) of an ldmatrix.trans register:
// keys (k, k+1) of dim d (kOdd false) or d+1 (kOdd true) as an f16 pair, key k in the low half.
template <DType C, bool kOdd>
__device__ __forceinline__ uint32_t fp8_key_pair_to_f16x2(uint32_t r) {
  if constexpr (C == DType::kF8E4M3) {
    return fp8x2_to_f16x2<C>(__byte_perm(r, 0u, kOdd ? 0x31 : 0x20));
  } else {
    return __byte_perm(r, 0u, kOdd ? 0x3414 : 0x2404);  // e5m2 bytes as f16 high bytes
  }
}

__device__ __forceinline__ void ldmatrix_x4_trans_bytes(uint32_t (&r)[4], const unsigned char* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// o += P · V for the 16 keys starting at the staged fp8 row `sv`. o[4·dd + w] covers the
// 32-dim block dd: w = 0 / 1 the even / odd dims of its first 16, w = 2 / 3 of its second 16.
template <int D, DType C>
__device__ __forceinline__ void pv_accumulate_fp8(float (&o)[D / 8][4], const float (&p)[2][4],
                                                  const unsigned char* sv, int lane) {
  constexpr int kRowBytes = DecodeShape<D, C>::kRowBytes;
  // Lane L addresses key (L & 7) + 8·((L >> 3) & 1), bytes 16·(L >> 4) of each 32-dim block:
  // matrices 0..3 = (keys 0-7, dims 0-15), (keys 8-15, dims 0-15), (keys 0-7, 16-31), (8-15,
  // 16-31).
  const unsigned char* base =
      sv + ((lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes + (lane >> 4) * 16;
  const uint32_t pa[4] = {pack_pair<true>(p[0][0], p[0][1]), pack_pair<true>(p[0][2], p[0][3]),
                          pack_pair<true>(p[1][0], p[1][1]), pack_pair<true>(p[1][2], p[1][3])};
#pragma unroll
  for (int dd = 0; dd < D / 32; ++dd) {
    // r[i]: keys (2c, 2c+1) of matrix i, dims (2g, 2g+1), as bytes k0d0 k0d1 k1d0 k1d1.
    uint32_t r[4];
    ldmatrix_x4_trans_bytes(r, base + dd * 32);
#pragma unroll
    for (int h = 0; h < 2; ++h) {                       // dims 0-15 / 16-31 of the block
      const uint32_t lo = r[2 * h], hi = r[2 * h + 1];  // keys 0-7 / 8-15 of the k-step
      mma_16816<true>(o[4 * dd + 2 * h], pa, fp8_key_pair_to_f16x2<C, false>(lo),
                      fp8_key_pair_to_f16x2<C, false>(hi));  // even dims
      mma_16816<true>(o[4 * dd + 2 * h + 1], pa, fp8_key_pair_to_f16x2<C, true>(lo),
                      fp8_key_pair_to_f16x2<C, true>(hi));  // odd dims
    }
  }
}

// Head dim of accumulator o[n][e] (e = 0..3 as in the C fragment; rows g, g+8 alike).
template <bool kFp8>
__device__ __forceinline__ int o_dim(int n, int e, int c) {
  if constexpr (kFp8) {
    const int w = n & 3;
    return (n >> 2) * 32 + (w >> 1) * 16 + (w & 1) + 4 * c + 2 * (e & 1);
  } else {
    return n * 8 + 2 * c + (e & 1);
  }
}

}  // namespace serval::kernels::cuda::decode
