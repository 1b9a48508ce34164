// Device building blocks of the paged decode attention kernel: tile constants, Q·Kᵀ scores,
// online softmax in the log2 domain, P·V accumulation (the mma primitives are in
// mma_fragments.cuh, shared with prefill).
//
// Cache element types (template parameter C): bf16 tiles run the mma in bf16; e4m3/e5m2 tiles run
// it in f16 (f32 accumulation). f16 represents every e4m3 and e5m2 value exactly, so K and V enter
// the tensor cores unrounded; q is converted bf16 → f16 (exact for 2^-14 ≤ |q| ≤ 65504: larger
// magnitudes saturate to ±65504, smaller ones become f16 subnormals, absolute error ≤ 2^-25) and
// the probabilities P are rounded to f16 (finer than bf16).
// Each warp owns 16 query rows; a thread holds rows g and g+8 (fragment layouts:
// mma_fragments.cuh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/attention/mma_fragments.cuh"

namespace serval::kernels::cuda::attn {

constexpr int kTileKeys = 64;  // keys per shared-memory KV tile
constexpr int kThreads = 128;  // 4 warps per decode CTA

template <DType C>
constexpr bool kIsFp8 = C == DType::kF8E4M3 || C == DType::kF8E5M2;

// 16-bit elements per row of an mma-ready tile: +16 bytes keeps lds/ldmatrix conflict-free.
template <int D>
constexpr int kMmaStride = D + 8;

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// s[j] = Q · K[8j .. 8j+7]ᵀ for the keys starting at smem row `sk` (raw dot products).
template <int D, int kNt, bool kF16>
__device__ __forceinline__ void qk_scores(float (&s)[kNt][4], const uint32_t (&qa)[D / 16][4],
                                          const uint16_t* sk, int g, int c) {
  constexpr int kStride = kMmaStride<D>;
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const uint16_t* row = sk + (8 * j + g) * kStride + 2 * c;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      mma_16816<kF16>(s[j], qa[kk], ld32(row + kk * 16), ld32(row + kk * 16 + 8));
  }
}

// Online softmax over one block of scores already in the log2 domain (scale·log2e applied,
// masked entries −inf). Updates the running max m and the thread-partial sums l of rows g
// (index 0) and g+8 (index 1), rescales o, and turns s into probabilities.
template <int kNt, int kOt>
__device__ __forceinline__ void online_softmax(float (&s)[kNt][4], float (&m)[2], float (&l)[2],
                                               float (&o)[kOt][4]) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // the 4 lanes of a quad share rows g, g+8
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
  }
  float base[2], corr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    base[i] = mx[i] == -INFINITY ? 0.0f : mx[i];  // all masked so far: avoid (−inf) − (−inf)
    corr[i] = exp2f(m[i] - base[i]);
    m[i] = mx[i];
    l[i] *= corr[i];
  }
#pragma unroll
  for (int n = 0; n < kOt; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    s[j][0] = exp2f(s[j][0] - base[0]);
    s[j][1] = exp2f(s[j][1] - base[0]);
    s[j][2] = exp2f(s[j][2] - base[1]);
    s[j][3] = exp2f(s[j][3] - base[1]);
    l[0] += s[j][0] + s[j][1];
    l[1] += s[j][2] + s[j][3];
  }
}

// o += P · V for the kNt·8 keys starting at smem row `sv`; P comes from C fragments (rows g, g+8).
template <int D, int kNt, bool kF16>
__device__ __forceinline__ void pv_accumulate(float (&o)[D / 8][4], const float (&p)[kNt][4],
                                              const uint16_t* sv, int lane) {
  constexpr int kStride = kMmaStride<D>;
  // ldmatrix row address of this lane: key (lane & 7) + 8·((lane >> 3) & 1), dims +8·(lane >> 4).
  const uint16_t* base = sv + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8;
#pragma unroll
  for (int q = 0; q < kNt / 2; ++q) {  // 16 keys per k-step
    const uint32_t pa[4] = {pack_pair<kF16>(p[2 * q][0], p[2 * q][1]),
                            pack_pair<kF16>(p[2 * q][2], p[2 * q][3]),
                            pack_pair<kF16>(p[2 * q + 1][0], p[2 * q + 1][1]),
                            pack_pair<kF16>(p[2 * q + 1][2], p[2 * q + 1][3])};
#pragma unroll
    for (int d = 0; d < D / 16; ++d) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + q * 16 * kStride + d * 16);
      mma_16816<kF16>(o[2 * d], pa, b[0], b[1]);
      mma_16816<kF16>(o[2 * d + 1], pa, b[2], b[3]);
    }
  }
}

// Sums the thread-partial row sums over the quad.
__device__ __forceinline__ void reduce_row_sums(float (&l)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
}

}  // namespace serval::kernels::cuda::attn
