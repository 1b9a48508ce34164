// Split-KV decode merge: combines the normalized partials (o, log2-sum-exp) of a sequence's active
// splits. Used by the last-arriving CTA of each (sequence, head group) inside decode_kernel, and
// by merge_kernel for grids too large for the arrival counters.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda::attn {

// Partial float4 loads in flight per output item and thread, and output items (4 consecutive dims
// of one row) per thread and pass: 16 float4 loads per thread cover 8 splits of two items in one
// L2 round trip.
constexpr int kMergeBatch = 8;
constexpr int kMergeItems = 2;
// Shared memory of merge_rows: weights [16 rows][kDecodeMaxSplits], row sums [16] and row maxima
// [16], fp32.
constexpr int kMergeScratchFloats = 16 * kDecodeMaxSplits + 32;

// Where merge_rows' result goes. out set: the bf16 output rows, times v_scale. Otherwise (the
// first level of a two-level merge) a normalized fp32 partial and its log2-sum-exp, like a split's
// own, in split slot `slot` of o_part / lse_part.
struct MergeOut {
  __nv_bfloat16* out = nullptr;
  float v_scale = 1.0f;
  float* o_part = nullptr;
  float* lse_part = nullptr;
  int slot = 0;

  __device__ static MergeOut to_output(__nv_bfloat16* out, float v_scale) {
    return {out, v_scale, nullptr, nullptr, 0};
  }
  __device__ static MergeOut to_slot(float* o_part, float* lse_part, int slot) {
    return {nullptr, 1.0f, o_part, lse_part, slot};
  }
};

// Merges the normalized partials (o, log2-sum-exp) of n splits, partial j being split first +
// j·stride, for rows r < num_rows (≤ 16) of (seq, head0 + r): o = Σ_j 2^(lse_j − max) · o_j /
// Σ_j 2^(lse_j − max), lse = max + log2 Σ_j 2^(lse_j − max). By all kThreads threads of the CTA
// (contains __syncthreads). Partial row (r, s) is (seq·Hq + head0 + r)·num_splits + s of o_part
// (D floats, 16-byte aligned) and lse_part. The sums are a fixed tree over j (a pure function of
// the partials): graph replays and eager runs agree bit for bit. The partials are read through L2
// (ld.global.cg): other CTAs of the running grid wrote them. Writing a partial into one of the
// merged slots is safe: each thread stores an item only after it has loaded all of that item's
// partials, and the lse after the barrier that ends their loads.
template <int D, int kThreads>
__device__ __forceinline__ void merge_rows(const float* o_part, const float* lse_part, int seq,
                                           int head0, int num_rows, int num_q_heads, int num_splits,
                                           int first, int stride, int n, float* scratch,
                                           const MergeOut& dst) {
  constexpr int kVec = D / 4;  // float4 per row
  constexpr int kWarps = kThreads / 32;
  constexpr int kRowsPerWarp = (16 + kWarps - 1) / kWarps;
  static_assert(kDecodeMaxSplits <= 64, "one warp holds a row's weights in two registers");
  float* weight = scratch;                         // [16][kDecodeMaxSplits]
  float* total = scratch + 16 * kDecodeMaxSplits;  // [16]
  float* row_max = total + 16;                     // [16]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t row_base = (int64_t(seq) * num_q_heads + head0) * num_splits;
  const int items = num_rows * kVec;
  const float4* o4 = reinterpret_cast<const float4*>(o_part);

  float4 part[kMergeItems][kMergeBatch];
  auto load_batch = [&](int i0, int j0) {
#pragma unroll
    for (int k = 0; k < kMergeItems; ++k) {
      const int i = i0 + k * kThreads + tid;
      const int r = i / kVec, v = i % kVec;
      const int64_t at = (row_base + int64_t(r) * num_splits + first) * kVec + v;
#pragma unroll
      for (int b = 0; b < kMergeBatch; ++b)
        part[k][b] = i < items && j0 + b < n ? __ldcg(o4 + at + int64_t(j0 + b) * stride * kVec)
                                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  load_batch(0, 0);  // in flight while the weights are computed

  // Weights: warp w takes rows w, w + kWarps, ...; lane l splits l and l + 32.
  float lse[kRowsPerWarp][2];
#pragma unroll
  for (int q = 0; q < kRowsPerWarp; ++q) {
    const int r = warp + q * kWarps;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = lane + 32 * h;
      lse[q][h] =
          r < num_rows && j < n
              ? __ldcg(lse_part + row_base + int64_t(r) * num_splits + first + int64_t(j) * stride)
              : -INFINITY;
    }
  }
#pragma unroll
  for (int q = 0; q < kRowsPerWarp; ++q) {
    const int r = warp + q * kWarps;
    if (r >= num_rows) break;  // warp-uniform
    float mx = fmaxf(lse[q][0], lse[q][1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      w[h] = lse[q][h] == -INFINITY ? 0.0f : exp2f(lse[q][h] - mx);  // absent split: 0
      if (lane + 32 * h < n) weight[r * kDecodeMaxSplits + lane + 32 * h] = w[h];
    }
    const float sum = warp_sum(w[0] + w[1]);
    if (lane == 0) {
      total[r] = sum;
      row_max[r] = mx;
    }
  }
  __syncthreads();  // every lse is loaded: the first level may overwrite its slot's
  if (dst.out == nullptr && tid < num_rows)
    dst.lse_part[row_base + int64_t(tid) * num_splits + dst.slot] =
        row_max[tid] + __log2f(total[tid]);

  for (int i0 = 0;;) {
    float4 acc[kMergeItems];
#pragma unroll
    for (int k = 0; k < kMergeItems; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j0 = 0; j0 < n; j0 += kMergeBatch) {
      if (j0 > 0) load_batch(i0, j0);
#pragma unroll
      for (int k = 0; k < kMergeItems; ++k) {
        const int i = i0 + k * kThreads + tid;
        const int r = min(i / kVec, 15);
#pragma unroll
        for (int b = 0; b < kMergeBatch; ++b) {
          if (j0 + b < n) {
            const float w = weight[r * kDecodeMaxSplits + j0 + b];
            acc[k].x += w * part[k][b].x;
            acc[k].y += w * part[k][b].y;
            acc[k].z += w * part[k][b].z;
            acc[k].w += w * part[k][b].w;
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kMergeItems; ++k) {
      const int i = i0 + k * kThreads + tid;
      if (i < items) {
        const int r = i / kVec, v = i % kVec;
        const float sum = total[r];
        if (dst.out != nullptr) {
          // out rows are 4-byte aligned by contract: two bf16x2 stores.
          auto* o = reinterpret_cast<__nv_bfloat162*>(
              dst.out + (int64_t(seq) * num_q_heads + head0 + r) * D + 4 * v);
          o[0] = __floats2bfloat162_rn(acc[k].x / sum * dst.v_scale, acc[k].y / sum * dst.v_scale);
          o[1] = __floats2bfloat162_rn(acc[k].z / sum * dst.v_scale, acc[k].w / sum * dst.v_scale);
        } else {
          reinterpret_cast<float4*>(
              dst.o_part)[(row_base + int64_t(r) * num_splits + dst.slot) * kVec + v] =
              make_float4(acc[k].x / sum, acc[k].y / sum, acc[k].z / sum, acc[k].w / sum);
        }
      }
    }
    i0 += kMergeItems * kThreads;
    if (i0 >= items) break;
    load_batch(i0, 0);
  }
}

}  // namespace serval::kernels::cuda::attn
