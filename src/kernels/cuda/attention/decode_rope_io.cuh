// The decode kernel's RoPE variant (paged_attention_rope, paged_decode.cu): q's raw rows from the
// fused QKV row, q-norm and RoPE into the staged fragments, and the step's new key and value
// computed (k-norm, RoPE, cache scales) and appended to the caches.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/attention/decode_shape.cuh"
#include "kernels/cuda/norm_rope/rope_lane.cuh"

namespace serval::kernels::cuda::decode {

using namespace attn;

// q rows of a CTA's 16 per warp, for a CTA of W warps.
template <int W>
constexpr int kRopeQRowsPerWarp = 16 / W;

// kRope: this warp's raw q rows (rows w, w + W, ... of the CTA's 16; a CTA of W warps) from the
// fused QKV row, as load_head gives them; rows ≥ num_rows untouched. After pdl_wait.
template <int D, int W>
__device__ __forceinline__ void load_rope_q(
    float (&x1)[kRopeQRowsPerWarp<W>][rope::Lanes<D>::kPairs],
    float (&x2)[kRopeQRowsPerWarp<W>][rope::Lanes<D>::kPairs], const __nv_bfloat16* q_row0,
    int num_rows, int warp, int lane) {
#pragma unroll
  for (int k = 0; k < kRopeQRowsPerWarp<W>; ++k) {  // every row's loads in flight together
    const int r = warp + W * k;
    if (r < num_rows) rope::load_head<D>(q_row0 + r * D, lane, x1[k], x2[k]);
  }
}

// kRope: q's rows of this CTA, loaded by load_rope_q, RoPE'd (and q-normed) into the staged
// fragments (QStage's layout, rows ≥ num_rows zero), the same bits as qk_norm_rope_kv's q_out.
// Warp w takes rows w, w + W, ...; lane l holds dims i and i + D/2 (rope_lane.cuh) and pairs
// them with lane l ^ 1 into the (d, d + 1) words of the fragments. After pdl_wait; whole warp.
template <int D, bool kFp8, int W>
__device__ __forceinline__ void stage_rope_q(
    uint32_t* q_staged, float (&x1)[kRopeQRowsPerWarp<W>][rope::Lanes<D>::kPairs],
    float (&x2)[kRopeQRowsPerWarp<W>][rope::Lanes<D>::kPairs], const DecodeRopeArgs& rope_args,
    int num_rows, int warp, int lane, const float (&w1)[rope::Lanes<D>::kPairs],
    const float (&w2)[rope::Lanes<D>::kPairs], const float (&cos_a)[rope::Lanes<D>::kPairs],
    const float (&sin_a)[rope::Lanes<D>::kPairs]) {
  using L = rope::Lanes<D>;
  using Q = QStage<D, kFp8, 32 * W>;
  static_assert(L::kHalf % 2 == 0, "dims i, i + 1 pair up across lanes");
#pragma unroll
  for (int k = 0; k < kRopeQRowsPerWarp<W>; ++k) {
    const int r = warp + W * k;  // warp-uniform
    uint32_t y1[L::kPairs] = {}, y2[L::kPairs] = {};
    if (r < num_rows) {
      if (rope_args.q_norm != nullptr) rope::rms_norm_head<D>(x1[k], x2[k], w1, w2, rope_args.eps);
      rope::rotate<D>(x1[k], x2[k], cos_a, sin_a);
#pragma unroll
      for (int j = 0; j < L::kPairs; ++j) {
        y1[j] = __bfloat16_as_ushort(__float2bfloat16(x1[k][j]));
        y2[j] = __bfloat16_as_ushort(__float2bfloat16(x2[k][j]));
      }
    }
#pragma unroll
    for (int j = 0; j < L::kPairs; ++j) {
      const uint32_t o1 = __shfl_xor_sync(0xffffffffu, y1[j], 1);
      const uint32_t o2 = __shfl_xor_sync(0xffffffffu, y2[j], 1);
      if (!L::owns(lane, j)) continue;
      const int i = lane + 32 * j;
      // Even lanes: dims (i, i + 1); odd lanes: dims (i − 1 + D/2, i + D/2).
      const bool even = (lane & 1) == 0;
      const int d = even ? i : i - 1 + L::kHalf;
      const uint32_t word = even ? (y1[j] | (o1 << 16)) : (o2 | (y2[j] << 16));
      q_staged[Q::frag_word(r, d)] = kFp8 ? bf16x2_to_f16x2(word) : word;
    }
  }
}

// kRope, the CTA holding key ctx − 1: warp 0 loads that key's raw row and warp 1 its value's from
// the fused QKV row (load_head's layout). After pdl_wait; warps 0 and 1 only.
template <int D>
__device__ __forceinline__ void load_new_row(float (&x1)[rope::Lanes<D>::kPairs],
                                             float (&x2)[rope::Lanes<D>::kPairs],
                                             const __nv_bfloat16* qkv_row, int num_q_heads,
                                             int num_kv_heads, int kv_head, int warp, int lane) {
  const bool is_v = warp == 1;
  rope::load_head<D>(qkv_row + (num_q_heads + (is_v ? num_kv_heads : 0) + kv_head) * D, lane, x1,
                     x2);
}

// Then warp 0 computes the key (k-norm, RoPE, / k_scale) and warp 1 the value (/ v_scale) as cache
// elements in `row` (rope::encode_head); sub-group 0 of the KV head also appends them to the caches
// at `slot` (≥ 0) for later steps.
template <int D, DType C>
__device__ __forceinline__ void rope_new_row(
    uint32_t (&row)[rope::Lanes<D>::kPairs], float (&x1)[rope::Lanes<D>::kPairs],
    float (&x2)[rope::Lanes<D>::kPairs], const DecodeRopeArgs& rope_args, int slot, bool append,
    int num_kv_heads, int kv_head, int warp, int lane, const float (&w1)[rope::Lanes<D>::kPairs],
    const float (&w2)[rope::Lanes<D>::kPairs], const float (&cos_a)[rope::Lanes<D>::kPairs],
    const float (&sin_a)[rope::Lanes<D>::kPairs]) {
  constexpr int kElemBytes = C == DType::kBF16 ? 2 : 1;
  const bool is_v = warp == 1;
  if (is_v) {
    rope::encode_head<D, C>(x1, x2, rope_args.inv_v_scale, row);
  } else {
    if (rope_args.k_norm != nullptr) rope::rms_norm_head<D>(x1, x2, w1, w2, rope_args.eps);
    rope::rotate<D>(x1, x2, cos_a, sin_a);
    rope::encode_head<D, C>(x1, x2, rope_args.inv_k_scale, row);
  }
  if (append && slot >= 0) {
    unsigned char* cache = is_v ? rope_args.v_cache : rope_args.k_cache;
    rope::store_head<D, C>(cache + (int64_t(slot) * num_kv_heads + kv_head) * D * kElemBytes, lane,
                           row);
  }
}

}  // namespace serval::kernels::cuda::decode
