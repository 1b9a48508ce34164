// bf16 GEMV for 1–4 tokens on bulk copies (see bf16_gemv.h, bf16_gemv_bulk).
//
// CTA i owns the weight rows [i·n/G, (i+1)·n/G) of a grid of G CTAs: one contiguous byte range
// of W, streamed front to back through kStages shared-memory stages of whole rows (≤ 16 KB,
// laid out as below) by one-instruction bulk copies (cp.async.bulk, completion counted by an
// mbarrier per stage). Thread 0 issues the first kStages copies before the PDL wait (weights only).
// A thread keeps the x pieces of its 4 columns in registers; after each stage's barrier thread r·M
// + t adds row r's warp sums in slot order: a fixed summation order (deterministic, graph replays
// equal eager runs).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/bf16_gemv_store.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/mbarrier.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"

namespace serval::kernels::cuda {

namespace {

// A stage holds up to 16 KB: kStagePieces 16-byte pieces of rows of k bf16 (k % 256 == 0), read
// by 256 threads × kPieces pieces, warp w's piece j being stage piece (8j + w)·32 + lane. With
// k % 256 == 0 a warp's 32 pieces of one j lie in one row, so a thread meets the same kPieces
// columns of the activation in every stage that starts at a row boundary, and each warp sum
// ("slot" 8j + w) belongs to one row: row r's total is the sum of slots r·k/256 .. (r+1)·k/256 − 1,
// added in slot order (deterministic).
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

constexpr int kStages = 4;  // stages in flight per CTA
constexpr int kSumsBytes = kStages * kSlots * kBf16GemvMaxM * 4;
// Stages, warp sums, then the stages' mbarriers (all dynamic: static shared memory beside the
// stages would move them off their 128-byte alignment).
constexpr int kSmem = kStages * kStageBytes + kSumsBytes + kStages * 8;

// Four tokens' x pieces take 64 registers: capped for two CTAs per SM that variant spills.
template <int M>
__global__ void __launch_bounds__(kThreads, M == 4 ? 1 : 2)
    bf16_gemv_bulk_kernel(Bf16GemvParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  float* sums = reinterpret_cast<float*>(smem + kStages * kStageBytes);  // [stage][slot][token]
  const int tid = threadIdx.x, k = p.k, rows_per_stage = stage_rows(k);
  const int row_begin = int(int64_t(blockIdx.x) * p.n / gridDim.x);
  const int row_end = int(int64_t(blockIdx.x + 1) * p.n / gridDim.x);
  const int stages = (row_end - row_begin + rows_per_stage - 1) / rows_per_stage;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(p.w) + size_t(row_begin) * k * 2;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bar0 = smem0 + kStages * kStageBytes + kSumsBytes;
  auto rows_of = [&](int q) {
    return min(rows_per_stage, row_end - row_begin - q * rows_per_stage);
  };
  // Stage q: rows [row_begin + q·R, min(+R, row_end)) into slot q % kStages.
  auto issue = [&](int q) {
    const int slot = q % kStages;
    const uint32_t bytes = uint32_t(rows_of(q)) * k * 2;
    expect_bytes(bar0 + 8 * slot, bytes);
    copy_rows(smem0 + slot * kStageBytes, w + size_t(q) * rows_per_stage * k * 2, bytes,
              bar0 + 8 * slot);
  };
  init_barriers(bar0, kStages);
  if (tid == 0)
    for (int q = 0; q < kStages && q < stages; ++q) issue(q);
  pdl_wait();
  pdl_launch_dependents();

  // x pieces of this thread's 4 columns, per token (tokens ≥ m repeat token m − 1, never stored).
  const __nv_bfloat16* xb = reinterpret_cast<const __nv_bfloat16*>(p.x);
  int piece_row[kPieces], col[kPieces];
  piece_layout(k, piece_row, col);
  uint4 x[M][kPieces];  // packed bf16: 16 M registers (floats would take 32 M)
#pragma unroll
  for (int j = 0; j < kPieces; ++j)
#pragma unroll
    for (int t = 0; t < M; ++t)
      x[t][j] = *reinterpret_cast<const uint4*>(xb + size_t(min(t, p.m - 1)) * k + col[j]);

  for (int q = 0; q < stages; ++q) {
    const int slot = q % kStages, rows = rows_of(q);
    mbarrier::wait(bar0 + 8 * slot, uint32_t(q / kStages) & 1u);
    float* stage_sums = sums + slot * kSlots * M;
    stage_warp_sums<M>(
        smem + slot * kStageBytes, x, piece_row, [&](int r) { return r < rows; }, stage_sums);
    __syncthreads();  // the stage is read and its warp sums are written
    if (tid == 0 && q + kStages < stages) issue(q + kStages);
    if (tid < rows * M) {
      const int r = tid / M, t = tid % M;
      if (t < p.m)
        store_gemv_out(p, t, row_begin + q * rows_per_stage + r, row_total<M>(stage_sums, r, t, k));
    }
  }
}

template <int M>
void launch(const Bf16GemvParams& p, int ctas_per_sm, cudaStream_t stream) {
  allow_dynamic_smem(bf16_gemv_bulk_kernel<M>, kSmem, "bf16_gemv_bulk");
  // At least one whole stage per CTA.
  const long max_ctas = (long(p.n) + stage_rows(p.k) - 1) / stage_rows(p.k);
  const long ctas = std::min<long>(max_ctas, long(sm_count()) * ctas_per_sm);
  launch_pdl("bf16_gemv_bulk", bf16_gemv_bulk_kernel<M>, dim3(unsigned(ctas)), dim3(kThreads),
             kSmem, stream, p);
}

}  // namespace

bool bf16_gemv_bulk_supported(const void* x, const void* w, int m, int k) {
  return bf16_gemv_supported(x, w, m, k) && k % 256 == 0 && k <= kMaxK;
}

void bf16_gemv_bulk(const Bf16GemvParams& p, int ctas_per_sm, cudaStream_t stream) {
  if (p.n <= 0 || ctas_per_sm < 1 || !bf16_gemv_bulk_supported(p.x, p.w, p.m, p.k))
    throw InvalidArgument(
        "bf16_gemv_bulk: need 1 <= m <= " + std::to_string(kBf16GemvMaxM) +
        ", n > 0, k % 256 == 0, k <= " + std::to_string(kMaxK) +
        ", 16-byte aligned x and w and ctas_per_sm >= 1; got m = " + std::to_string(p.m) +
        ", n = " + std::to_string(p.n) + ", k = " + std::to_string(p.k));
  if (p.m == 1) {
    launch<1>(p, ctas_per_sm, stream);
  } else if (p.m == 2) {
    launch<2>(p, ctas_per_sm, stream);
  } else {
    launch<4>(p, ctas_per_sm, stream);
  }
}

}  // namespace serval::kernels::cuda
