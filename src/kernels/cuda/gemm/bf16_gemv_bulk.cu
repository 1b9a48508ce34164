// bf16 GEMV for 1–4 tokens on bulk copies (see bf16_gemv.h, bf16_gemv_bulk).
//
// CTA i owns the weight rows [i·n/G, (i+1)·n/G) of a grid of G CTAs: one contiguous byte range
// of W, streamed front to back through kStages shared-memory stages of kStageRows(k) whole rows
// (≤ 16 KB) by one-instruction bulk copies (cp.async.bulk, completion counted by an mbarrier per
// stage). Thread 0 issues the first kStages copies before the PDL wait (weights only). Every stage
// is read the same way: 256 threads × 4 pieces of 8 bf16, warp w's piece j covering the stage's
// pieces (8j + w)·32 + lane; with k % 256 == 0 a warp's 32 pieces of one j lie in one row, so a
// thread meets the same 4 columns of x in every stage (held in registers). Each warp sums its 32
// lanes per (j, token) and thread r·M + t adds row r's k/256 warp sums in slot order after the
// stage's barrier: a fixed summation order (deterministic, graph replays equal eager runs).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/row_stream.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/mbarrier.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"

namespace serval::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPieces = 4;                        // 16-byte pieces per thread and stage
constexpr int kStagePieces = kThreads * kPieces;  // 1024 pieces: 16 KB
constexpr int kStageBytes = kStagePieces * 16;
constexpr int kSlots = kStagePieces / 32;  // warp sums per stage and token
constexpr int kStages = 4;                 // stages in flight per CTA
constexpr int kMaxK = kStagePieces * 8;    // one row fills a stage: 8192
constexpr int kSumsBytes = kStages * kSlots * kBf16GemvMaxM * 4;
// Stages, warp sums, then the stages' mbarriers (all dynamic: static shared memory beside the
// stages would move them off their 128-byte alignment).
constexpr int kSmem = kStages * kStageBytes + kSumsBytes + kStages * 8;

// Rows per stage: as many whole rows as fit 16 KB (k % 256 == 0, k ≤ kMaxK).
__host__ __device__ constexpr int stage_rows(int k) {
  return kStagePieces / (k / 8);
}

__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%2], [%3], %1, [%0];\n" ::
          "r"(bar),
      "r"(bytes), "r"(dst), "l"(src)
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

// Four tokens' x pieces take 64 registers: capped for two CTAs per SM that variant spills.
template <int M>
__global__ void __launch_bounds__(kThreads, M == 4 ? 1 : 2)
    bf16_gemv_bulk_kernel(Bf16GemvParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  float* sums = reinterpret_cast<float*>(smem + kStages * kStageBytes);  // [stage][slot][token]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k = p.k, rows_per_stage = stage_rows(k), row_pieces = k / 8;
  const int row_begin = int(int64_t(blockIdx.x) * p.n / gridDim.x);
  const int row_end = int(int64_t(blockIdx.x + 1) * p.n / gridDim.x);
  const int stages = (row_end - row_begin + rows_per_stage - 1) / rows_per_stage;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(p.w) + size_t(row_begin) * k * 2;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bar0 = smem0 + kStages * kStageBytes + kSumsBytes;
  // Stage q: rows [row_begin + q·R, min(+R, row_end)) into slot q % kStages.
  auto issue = [&](int q) {
    const int rows = min(rows_per_stage, row_end - row_begin - q * rows_per_stage);
    const int slot = q % kStages;
    bulk_copy(smem0 + slot * kStageBytes, w + size_t(q) * rows_per_stage * k * 2,
              uint32_t(rows) * k * 2, bar0 + 8 * slot);
  };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier::init(bar0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int q = 0; q < kStages && q < stages; ++q) issue(q);
  }
  __syncthreads();  // barriers initialized before anyone waits on them
  pdl_wait();
  pdl_launch_dependents();

  // x pieces of this thread's 4 columns, per token (tokens ≥ m repeat token m − 1, never stored).
  const __nv_bfloat16* xb = reinterpret_cast<const __nv_bfloat16*>(p.x);
  uint4 x[M][kPieces];     // packed bf16: 16 M registers (floats would take 32 M)
  int piece_row[kPieces];  // row within the stage of piece j
#pragma unroll
  for (int j = 0; j < kPieces; ++j) {
    const int piece = (j * kWarps + warp) * 32 + lane;
    piece_row[j] = piece / row_pieces;
    const int col = (piece % row_pieces) * 8;
#pragma unroll
    for (int t = 0; t < M; ++t)
      x[t][j] = *reinterpret_cast<const uint4*>(xb + size_t(min(t, p.m - 1)) * k + col);
  }

  for (int q = 0; q < stages; ++q) {
    const int slot = q % kStages;
    const int rows = min(rows_per_stage, row_end - row_begin - q * rows_per_stage);
    mbarrier::wait(bar0 + 8 * slot, uint32_t(q / kStages) & 1u);
    const uint4* stage = reinterpret_cast<const uint4*>(smem + slot * kStageBytes);
    float* stage_sums = sums + slot * kSlots * M;
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      if (piece_row[j] >= rows) continue;  // warp-uniform: a warp's 32 pieces share a row
      const uint4 wv = stage[(j * kWarps + warp) * 32 + lane];
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const float s = warp_sum(dot8_bf16x2(wv, x[t][j]));
        if (lane == 0) stage_sums[(j * kWarps + warp) * M + t] = s;
      }
    }
    __syncthreads();  // the stage is read and its warp sums are written
    if (tid == 0 && q + kStages < stages) issue(q + kStages);
    if (tid < rows * M) {
      const int r = tid / M, t = tid % M, per_row = row_pieces / 32;
      float v = 0.0f;
      for (int i = 0; i < per_row; ++i) v += stage_sums[(r * per_row + i) * M + t];
      const int row = row_begin + q * rows_per_stage + r;
      if (p.bias) v += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[row]);
      if (t < p.m) {
        const size_t at = size_t(t) * p.n + row;
        if (p.y_f32) {
          static_cast<float*>(p.y)[at] = v;
        } else {
          static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(v);
        }
      }
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
