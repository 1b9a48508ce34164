// Warp-level streaming of whole bf16 weight rows for GEMV-style kernels (bf16_gemv, the MoE
// GEMVs). A "slice" is 256 columns: lane l holds columns 8l..8l+7 of it (one 16-byte load per row;
// 512 contiguous bytes per warp load, so DRAM pages are read front to back). Stages of S slices
// of all R rows are double-buffered in registers; start() requests the first two stages (before
// the PDL wait when the rows are known then), accumulate() consumes them in order and refills a
// slot as soon as it has been used. Included only by .cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda {

constexpr int kRowSliceCols = 256;

__device__ __forceinline__ uint4 ld_stream_row(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

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

template <int R, int S>
struct RowStream {
  const __nv_bfloat16* row[R];  // row r's first column
  int k, lane, slices;
  uint4 ring[2][S][R];

  // Stage starting at slice s0 into `slot`; columns ≥ k read as zero.
  __device__ __forceinline__ void load(int s0, int slot) {
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int col = (s0 + u) * kRowSliceCols + 8 * lane;
#pragma unroll
      for (int r = 0; r < R; ++r)
        ring[slot][u][r] = col < k ? ld_stream_row(row[r] + col) : make_uint4(0, 0, 0, 0);
    }
  }

  // rows[r] must be 16-byte aligned and hold k (% 8 == 0) bf16.
  __device__ __forceinline__ void start(const __nv_bfloat16* const (&rows)[R], int k_, int lane_) {
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = rows[r];
    k = k_;
    lane = lane_;
    slices = (k + kRowSliceCols - 1) / kRowSliceCols;
    load(0, 0);
    if (S < slices) load(S, 1);
  }

  // acc[t][r] += Σ_c row[r][c] · x(t, r)[c] over all columns, per lane (the caller reduces across
  // the warp). x(t, r) returns the activation row (k bf16, 16-byte aligned) that row r meets for
  // token t; without kPerRowX every row meets x(t, 0) (loaded once per token). Activations are
  // read with plain loads, so call this after the PDL wait.
  template <int M, bool kPerRowX, typename XRow>
  __device__ __forceinline__ void accumulate(XRow x, float (&acc)[M][R]) {
    for (int base = 0; base < slices; base += 2 * S) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int s0 = base + j * S;
        if (s0 >= slices) break;
#pragma unroll
        for (int u = 0; u < S; ++u) {
          const int col = (s0 + u) * kRowSliceCols + 8 * lane;
          if (col >= k) continue;
#pragma unroll
          for (int t = 0; t < M; ++t) {
            float xv[8];
            if constexpr (!kPerRowX) load8(x(t, 0) + col, xv);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              if constexpr (kPerRowX) load8(x(t, r) + col, xv);
              acc[t][r] = dot8_bf16(ring[j][u][r], xv, acc[t][r]);
            }
          }
        }
        if (s0 + 2 * S < slices) load(s0 + 2 * S, j);
      }
    }
  }
};

}  // namespace serval::kernels::cuda
