// The per-warp math of qk_norm_rope_kv, shared with the decode attention kernel that applies it
// itself (paged_decode.cu), so that both give the same bits. One warp holds one head of D values:
// lane l owns the rotary pairs (i, i + D/2), i = l + 32·j < D/2, j < kPairs. Every operation is
// an explicitly rounded intrinsic, so that no contraction into FMAs can differ between the two
// kernels. Included only by .cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda::rope {

template <int D>
struct Lanes {
  static constexpr int kHalf = D / 2;
  static constexpr int kPairs = (kHalf + 31) / 32;  // rotary pairs per lane
  __device__ __forceinline__ static bool owns(int lane, int j) { return lane + 32 * j < kHalf; }
};

// Norm weights of this lane's pairs (0 where norm_w is null or `ok` is false). Weights only:
// callable before pdl_wait.
template <int D>
__device__ __forceinline__ void load_norm_weights(const __nv_bfloat16* norm_w, int lane, bool ok,
                                                  float (&w1)[Lanes<D>::kPairs],
                                                  float (&w2)[Lanes<D>::kPairs]) {
  using L = Lanes<D>;
#pragma unroll
  for (int j = 0; j < L::kPairs; ++j) {
    const int i = lane + 32 * j;
    const bool load = ok && norm_w != nullptr && L::owns(lane, j);
    w1[j] = load ? __bfloat162float(norm_w[i]) : 0.0f;
    w2[j] = load ? __bfloat162float(norm_w[i + L::kHalf]) : 0.0f;
  }
}

// Inverse frequencies of this lane's pairs (0 where `ok` is false). Callable before pdl_wait.
template <int D>
__device__ __forceinline__ void load_inv_freq(const float* inv_freq, int lane, bool ok,
                                              float (&freq)[Lanes<D>::kPairs]) {
#pragma unroll
  for (int j = 0; j < Lanes<D>::kPairs; ++j)
    freq[j] = ok && Lanes<D>::owns(lane, j) ? inv_freq[lane + 32 * j] : 0.0f;
}

// This lane's pairs of the head at `src` (D bf16 values), as fp32; 0 for pairs it does not own.
template <int D>
__device__ __forceinline__ void load_head(const __nv_bfloat16* src, int lane,
                                          float (&x1)[Lanes<D>::kPairs],
                                          float (&x2)[Lanes<D>::kPairs]) {
  using L = Lanes<D>;
#pragma unroll
  for (int j = 0; j < L::kPairs; ++j) {
    const int i = lane + 32 * j;
    x1[j] = L::owns(lane, j) ? __bfloat162float(src[i]) : 0.0f;
    x2[j] = L::owns(lane, j) ? __bfloat162float(src[i + L::kHalf]) : 0.0f;
  }
}

// x · rsqrt(mean(x²) + eps) · w over the head. Whole warp (a shuffle reduction).
template <int D>
__device__ __forceinline__ void rms_norm_head(float (&x1)[Lanes<D>::kPairs],
                                              float (&x2)[Lanes<D>::kPairs],
                                              const float (&w1)[Lanes<D>::kPairs],
                                              const float (&w2)[Lanes<D>::kPairs], float eps) {
  using L = Lanes<D>;
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < L::kPairs; ++j)
    sum_sq = __fadd_rn(sum_sq, __fadd_rn(__fmul_rn(x1[j], x1[j]), __fmul_rn(x2[j], x2[j])));
  const float inv = rsqrtf(__fadd_rn(__fdiv_rn(warp_sum(sum_sq), float(D)), eps));
#pragma unroll
  for (int j = 0; j < L::kPairs; ++j) {
    x1[j] = __fmul_rn(x1[j], __fmul_rn(inv, w1[j]));
    x2[j] = __fmul_rn(x2[j], __fmul_rn(inv, w2[j]));
  }
}

// cos and sin of position · inv_freq for this lane's pairs.
template <int D>
__device__ __forceinline__ void angles(float pos, const float (&freq)[Lanes<D>::kPairs],
                                       float (&cos_a)[Lanes<D>::kPairs],
                                       float (&sin_a)[Lanes<D>::kPairs]) {
#pragma unroll
  for (int j = 0; j < Lanes<D>::kPairs; ++j) sincosf(__fmul_rn(pos, freq[j]), &sin_a[j], &cos_a[j]);
}

// (x1, x2) rotated by the angle: y1 = x1·c − x2·s, y2 = x2·c + x1·s.
template <int D>
__device__ __forceinline__ void rotate(float (&x1)[Lanes<D>::kPairs], float (&x2)[Lanes<D>::kPairs],
                                       const float (&cos_a)[Lanes<D>::kPairs],
                                       const float (&sin_a)[Lanes<D>::kPairs]) {
#pragma unroll
  for (int j = 0; j < Lanes<D>::kPairs; ++j) {
    const float y1 = __fsub_rn(__fmul_rn(x1[j], cos_a[j]), __fmul_rn(x2[j], sin_a[j]));
    const float y2 = __fadd_rn(__fmul_rn(x2[j], cos_a[j]), __fmul_rn(x1[j], sin_a[j]));
    x1[j] = y1;
    x2[j] = y2;
  }
}

// Bits of a cache element pair of type C: a in the low element (bf16: 16 bits each; fp8: 8),
// round to nearest even; fp8 saturates to the largest finite value (cvt.rn.satfinite).
template <DType C>
__device__ __forceinline__ uint32_t encode_pair(float a, float b) {
  if constexpr (C == DType::kBF16) {
    return uint32_t(__bfloat16_as_ushort(__float2bfloat16(a))) |
           (uint32_t(__bfloat16_as_ushort(__float2bfloat16(b))) << 16);
  } else {
    constexpr __nv_fp8_interpretation_t kFormat = C == DType::kF8E4M3 ? __NV_E4M3 : __NV_E5M2;
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFormat);
  }
}

// Stores an encode_pair<C> result as elements i (low) and i + half of `row` (global or shared).
template <DType C>
__device__ __forceinline__ void store_pair(void* row, int i, int half, uint32_t pair) {
  if constexpr (C == DType::kBF16) {
    auto* p = static_cast<uint16_t*>(row);
    p[i] = uint16_t(pair & 0xFFFFu);
    p[i + half] = uint16_t(pair >> 16);
  } else {
    auto* p = static_cast<uint8_t*>(row);
    p[i] = uint8_t(pair & 0xFFu);
    p[i + half] = uint8_t((pair >> 8) & 0xFFu);
  }
}

// This lane's pairs times `inv_scale` (each product rounded to fp32, as the CPU kv_append), as
// cache elements of type C (encode_pair).
template <int D, DType C>
__device__ __forceinline__ void encode_head(const float (&x1)[Lanes<D>::kPairs],
                                            const float (&x2)[Lanes<D>::kPairs], float inv_scale,
                                            uint32_t (&pairs)[Lanes<D>::kPairs]) {
#pragma unroll
  for (int j = 0; j < Lanes<D>::kPairs; ++j)
    pairs[j] = encode_pair<C>(__fmul_rn(x1[j], inv_scale), __fmul_rn(x2[j], inv_scale));
}

// Stores this lane's encoded pairs into a head row of D elements of type C.
template <int D, DType C>
__device__ __forceinline__ void store_head(void* row, int lane,
                                           const uint32_t (&pairs)[Lanes<D>::kPairs]) {
#pragma unroll
  for (int j = 0; j < Lanes<D>::kPairs; ++j)
    if (Lanes<D>::owns(lane, j)) store_pair<C>(row, lane + 32 * j, Lanes<D>::kHalf, pairs[j]);
}

}  // namespace serval::kernels::cuda::rope
