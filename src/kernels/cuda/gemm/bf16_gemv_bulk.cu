// bf16 GEMV for 1–4 tokens on bulk copies (see bf16_gemv.h, bf16_gemv_bulk).
//
// CTA i owns the weight rows [i·n/G, (i+1)·n/G) of a grid of G CTAs: one contiguous byte range
// of W, streamed front to back through kStages shared-memory stages of whole rows (≤ 16 KB,
// bulk_stage.cuh) by one-instruction bulk copies (cp.async.bulk, completion counted by an mbarrier
// per stage). Thread 0 issues the first kStages copies before the PDL wait (weights only). A
// thread keeps the x pieces of its 4 columns in registers; after each stage's barrier thread
// r·M + t adds row r's warp sums in slot order: a fixed summation order (deterministic, graph
// replays equal eager runs).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/bf16_gemv_store.cuh"
#include "kernels/cuda/gemm/bulk_stage.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"

namespace serval::kernels::cuda {

namespace {

using namespace bulk;
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
