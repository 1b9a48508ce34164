// Shared-memory stages of whole bf16 weight rows filled by bulk copies, for the bulk-copy GEMVs
// (bf16_gemv_bulk.cu). Included only by .cu files.
//
// A stage holds up to 16 KB: kStagePieces 16-byte pieces of rows of k bf16 (k % 256 == 0), read
// by 256 threads × kPieces pieces, warp w's piece j being stage piece (8j + w)·32 + lane. With
// k % 256 == 0 a warp's 32 pieces of one j lie in one row, so a thread meets the same kPieces
// columns of the activation in every stage that starts at a row boundary, and each warp sum
// ("slot" 8j + w) belongs to one row: row r's total is the sum of slots r·k/256 .. (r+1)·k/256 − 1,
// added in slot order (deterministic).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/mbarrier.cuh"

namespace serval::kernels::cuda::bulk {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPieces = 4;                        // 16-byte pieces per thread and stage
constexpr int kStagePieces = kThreads * kPieces;  // 1024 pieces
constexpr int kStageBytes = kStagePieces * 16;    // 16 KB
constexpr int kSlots = kStagePieces / 32;         // warp sums per stage and token
constexpr int kMaxK = kStagePieces * 8;           // one row fills a stage

// Whole rows of k bf16 per stage (k % 256 == 0, k ≤ kMaxK).
__host__ __device__ constexpr int stage_rows(int k) {
  return kStagePieces / (k / 8);
}

// Stage piece of this thread's piece j.
__device__ __forceinline__ int piece_of(int j, int warp, int lane) {
  return (j * kWarps + warp) * 32 + lane;
}

// Thread 0 initializes the stages' mbarriers (bar0, bar0 + 8, ...); the whole CTA then passes a
// barrier, so no thread waits on one before it exists. Call from all threads.
__device__ __forceinline__ void init_barriers(uint32_t bar0, int stages) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbarrier::init(bar0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
}

// This thread's stage row and activation column of each of its pieces, for rows of k bf16.
__device__ __forceinline__ void piece_layout(int k, int (&piece_row)[kPieces],
                                             int (&col)[kPieces]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kPieces; ++j) {
    const int piece = piece_of(j, warp, lane);
    piece_row[j] = piece / (k / 8);
    col[j] = (piece % (k / 8)) * 8;
  }
}

// One arrival on `bar` that expects `bytes` more transaction bytes in this phase; the copies that
// deliver them follow (copy_rows), so the phase completes once all of them have landed.
__device__ __forceinline__ void expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Bulk copy of `bytes` (a multiple of 16; src and dst 16-byte aligned) counted on `bar`.
__device__ __forceinline__ void copy_rows(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Σ_i w[i]·x[i] over eight bf16 pairs (raw words: a bf16's fp32 value is its bits shifted up 16),
// in index order from 0.
__device__ __forceinline__ float dot8_bf16x2(const uint4& w, const uint4& x) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(ws[i] << 16), __uint_as_float(xs[i] << 16), acc);
    acc = fmaf(__uint_as_float(ws[i] & 0xFFFF0000u), __uint_as_float(xs[i] & 0xFFFF0000u), acc);
  }
  return acc;
}

// The warp sums of one stage for M tokens: sums[slot · M + t] for every slot whose row is valid
// (row_valid(stage row), warp-uniform). x[t][j]: this thread's activation pieces.
template <int M, typename RowValid>
__device__ __forceinline__ void stage_warp_sums(const uint8_t* stage, const uint4 (&x)[M][kPieces],
                                                const int (&piece_row)[kPieces], RowValid row_valid,
                                                float* sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kPieces; ++j) {
    if (!row_valid(piece_row[j])) continue;  // warp-uniform: a warp's 32 pieces share a row
    const uint4 wv = reinterpret_cast<const uint4*>(stage)[piece_of(j, warp, lane)];
#pragma unroll
    for (int t = 0; t < M; ++t) {
      const float s = warp_sum(dot8_bf16x2(wv, x[t][j]));
      if (lane == 0) sums[(j * kWarps + warp) * M + t] = s;
    }
  }
}

// Row r's total for token t from a stage's warp sums (k / 256 slots per row, in order).
template <int M>
__device__ __forceinline__ float row_total(const float* sums, int r, int t, int k) {
  const int per_row = k / 256;
  float v = 0.0f;
  for (int i = 0; i < per_row; ++i) v += sums[(r * per_row + i) * M + t];
  return v;
}

}  // namespace serval::kernels::cuda::bulk
