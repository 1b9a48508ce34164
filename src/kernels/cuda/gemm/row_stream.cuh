// Warp-level streaming of whole bf16 weight rows for GEMV-style kernels (bf16_gemv, the MoE
// GEMVs). A warp owns a list of items (item = R rows of k columns, e.g. a row pair of a matrix);
// a "slice" is 256 columns, lane l holding columns 8l..8l+7 (one 16-byte load per row, 512
// contiguous bytes per warp load, so DRAM pages are read front to back). The warp's slices form
// one sequence of stages (S slices of one item each) that a two-slot register ring runs through
// without a break between items: the next item's first stage is in flight while the current one
// is finished and stored, so a warp with several items pays the memory latency once. Kernels
// size their grids with row_stream_ctas and give each warp every (gridDim·warps)-th item. Included
// only by .cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda {

constexpr int kRowSliceCols = 256;

// acc + Σ_i w[i]·x[i] over the eight bf16 of `w` (raw words: a bf16's fp32 value is its bits
// shifted up 16), in index order.
__device__ __forceinline__ float dot8_bf16(const uint4& w, const float (&x)[8], float acc) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(words[i] << 16), x[2 * i], acc);
    acc = fmaf(__uint_as_float(words[i] & 0xFFFF0000u), x[2 * i + 1], acc);
  }
  return acc;
}

// R rows per item, S slices per stage. RowsOf: rows_of(i, rows) sets rows[0..R) to the first
// column of item i's rows (the warp's i-th item; 16-byte aligned, k bf16 each).
template <int R, int S, typename RowsOf>
struct RowStream {
  RowsOf rows_of;
  int items, k, lane, stages_per_item, stages;
  uint4 ring[2][S][R];

  __device__ __forceinline__ RowStream(RowsOf rows, int items_, int k_, int lane_)
      : rows_of(rows), items(items_), k(k_), lane(lane_) {
    stages_per_item = (k + S * kRowSliceCols - 1) / (S * kRowSliceCols);
    stages = items * stages_per_item;
  }

  // Stage q into `slot`; columns ≥ k read as zero.
  __device__ __forceinline__ void load(int q, int slot) {
    const __nv_bfloat16* rows[R];
    rows_of(q / stages_per_item, rows);
    const int s0 = (q % stages_per_item) * S;
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int col = (s0 + u) * kRowSliceCols + 8 * lane;
#pragma unroll
      for (int r = 0; r < R; ++r)
        ring[slot][u][r] = col < k ? ld_stream16(rows[r] + col) : make_uint4(0, 0, 0, 0);
    }
  }

  // Requests the first two stages (may precede the PDL wait when rows_of reads only constants).
  __device__ __forceinline__ void start() {
    if (stages > 0) load(0, 0);
    if (stages > 1) load(1, 1);
  }

  // For every item i in order: acc[t][r] = Σ_c row[r][c] · x(i, t, r)[c] per lane (the caller
  // reduces across the warp in done(i, acc)). x(i, t, r) is the activation row (k bf16, 16-byte
  // aligned, read with plain loads: call after the PDL wait) that row r of item i meets for token
  // t; without kPerRowX every row meets x(i, t, 0), loaded once per token.
  template <int M, bool kPerRowX, typename XRow, typename Done>
  __device__ __forceinline__ void run(XRow x, Done done) {
    float acc[M][R];
#pragma unroll
    for (int t = 0; t < M; ++t)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[t][r] = 0.0f;
    for (int q0 = 0; q0 < stages; q0 += 2) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int q = q0 + j;
        if (q >= stages) break;
        const int item = q / stages_per_item, s0 = (q % stages_per_item) * S;
#pragma unroll
        for (int u = 0; u < S; ++u) {
          const int col = (s0 + u) * kRowSliceCols + 8 * lane;
          if (col >= k) continue;
#pragma unroll
          for (int t = 0; t < M; ++t) {
            float xv[8];
            if constexpr (!kPerRowX) load8(x(item, t, 0) + col, xv);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              if constexpr (kPerRowX) load8(x(item, t, r) + col, xv);
              acc[t][r] = dot8_bf16(ring[j][u][r], xv, acc[t][r]);
            }
          }
        }
        if (q + 2 < stages) load(q + 2, j);  // the slot is free: refill it two stages ahead
        if ((q + 1) % stages_per_item == 0) {
          done(item, acc);
#pragma unroll
          for (int t = 0; t < M; ++t)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[t][r] = 0.0f;
        }
      }
    }
  }
};

// Items of warp `warp` (of `warps` in the grid) among `total`: warp, warp + warps, ...
__device__ __forceinline__ int row_stream_items(int total, int warp, int warps) {
  return warp < total ? (total - warp + warps - 1) / warps : 0;
}

// Resident CTAs per SM of `kernel` at `warps_per_cta` warps (≥ 1). Callers cache it per kernel
// (a static in the launcher): the query costs host time every eager step otherwise.
template <typename Kernel>
int row_stream_ctas_per_sm(Kernel kernel, int warps_per_cta) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps_per_cta * 32, 0) !=
      cudaSuccess)
    per_sm = 1;
  return std::max(per_sm, 1);
}

// CTAs for `total` items of one warp each: one warp per item while that is at most two waves
// of resident CTAs (the hardware starts the second wave as the first drains, which measured
// faster on Qwen3-sized matrices than looping), else two waves' worth, each warp then taking
// several items through its ring (faster on Llama-70B-sized ones).
inline unsigned row_stream_ctas(int ctas_per_sm, int warps_per_cta, long total) {
  const long needed = (total + warps_per_cta - 1) / warps_per_cta;
  return unsigned(std::max<long>(1, std::min<long>(needed, 2l * ctas_per_sm * sm_count())));
}

}  // namespace serval::kernels::cuda
