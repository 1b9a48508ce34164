// bf16 MoE expert GEMVs for one or two tokens on bulk copies (see moe_gemv_bf16_bulk.h).
//
//   gate_up: CTA (span s, pair p) owns channels [s·I/S, (s+1)·I/S) of pair p's expert; a stage
//            holds g = stage_rows(hidden) / 2 of its gate rows, then the g matching up rows (two
//            bulk copies on one mbarrier), so a thread r < g finishes channel r of the stage.
//   down:    CTA (span s, token t) owns hidden units [s·H/S, (s+1)·H/S) (at most one stage of
//            rows of inter); its stages are those rows of each local choice's expert in choice
//            order, and thread r keeps unit r's weighted sum across them. The token's activations
//            (top_k · inter bf16) are staged in shared memory once.
// Both keep kStages stages in flight, issued by thread 0 once the expert ids are known (after the
// PDL wait: the weights to read depend on the routing).
#include "kernels/cuda/moe/moe_gemv_bf16_bulk.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/bulk_stage.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"

namespace serval::kernels::cuda {

namespace {

using namespace bulk;
constexpr int kMaxTopK = 8;
constexpr int kMaxActElems = 12288;  // the down kernel's staged activations: 24 KB
constexpr int kMaxHidden = kMaxK / 2;
constexpr int kGateUpStages = 4, kDownStages = 3;
constexpr int kCtasPerSm = 3;

// Shared memory: stages, warp sums (one token), then (down) the activations, ids and weights,
// then the mbarriers. All dynamic: static shared memory would move the stages off their
// 128-byte alignment.
__host__ __device__ constexpr int sums_bytes(int stages) {
  return stages * kSlots * 4;
}
constexpr int kGateUpSmem = kGateUpStages * kStageBytes + sums_bytes(kGateUpStages) + 8 * 8;
constexpr int kDownActOffset = kDownStages * kStageBytes + sums_bytes(kDownStages);
constexpr int kDownSmem = kDownActOffset + kMaxActElems * 2 + kMaxTopK * 8 + 8 * 8;

__global__ void __launch_bounds__(kThreads, 2) gate_up_kernel(MoeBf16BulkParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  float* sums = reinterpret_cast<float*>(smem + kGateUpStages * kStageBytes);  // [stage][slot]
  const int tid = threadIdx.x, H = p.hidden, I = p.inter, pair = blockIdx.y;
  const int g = stage_rows(H) / 2;  // channels per stage
  const int c0 = int(int64_t(blockIdx.x) * I / gridDim.x);
  const int c1 = int(int64_t(blockIdx.x + 1) * I / gridDim.x);
  const int stages = (c1 - c0 + g - 1) / g;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bar0 = smem0 + kGateUpStages * kStageBytes + sums_bytes(kGateUpStages);
  init_barriers(bar0, kGateUpStages);
  pdl_wait();  // the routing's ids
  pdl_launch_dependents();
  const int e = p.topk_ids[pair] - p.local_offset;
  if (e < 0 || e >= p.num_local) return;  // whole CTA; down skips this choice

  const size_t row_bytes = size_t(H) * 2;
  const uint8_t* gate =
      reinterpret_cast<const uint8_t*>(p.gate_up) + (size_t(e) * 2 * I + c0) * row_bytes;
  const uint8_t* up = gate + size_t(I) * row_bytes;
  auto channels = [&](int q) { return min(g, c1 - c0 - q * g); };
  auto issue = [&](int q) {
    const int slot = q % kGateUpStages;
    const uint32_t bytes = uint32_t(channels(q)) * uint32_t(row_bytes), bar = bar0 + 8 * slot;
    const uint32_t dst = smem0 + slot * kStageBytes;
    expect_bytes(bar, 2 * bytes);
    copy_rows(dst, gate + size_t(q) * g * row_bytes, bytes, bar);
    copy_rows(dst + uint32_t(g * row_bytes), up + size_t(q) * g * row_bytes, bytes, bar);
  };
  if (tid == 0)
    for (int q = 0; q < kGateUpStages && q < stages; ++q) issue(q);

  int piece_row[kPieces], col[kPieces];
  piece_layout(H, piece_row, col);
  const __nv_bfloat16* x_row =
      reinterpret_cast<const __nv_bfloat16*>(p.x) + size_t(pair / p.top_k) * H;
  uint4 x[1][kPieces];
#pragma unroll
  for (int j = 0; j < kPieces; ++j) x[0][j] = *reinterpret_cast<const uint4*>(x_row + col[j]);

  __nv_bfloat16* act = reinterpret_cast<__nv_bfloat16*>(p.act) + size_t(pair) * I + c0;
  for (int q = 0; q < stages; ++q) {
    const int slot = q % kGateUpStages, n = channels(q);
    mbarrier::wait(bar0 + 8 * slot, uint32_t(q / kGateUpStages) & 1u);
    float* stage_sums = sums + slot * kSlots;
    // Rows [0, n) are gate rows, [g, g + n) the up rows of the same channels.
    stage_warp_sums<1>(
        smem + slot * kStageBytes, x, piece_row, [&](int r) { return r < g ? r < n : r - g < n; },
        stage_sums);
    __syncthreads();  // the stage is read and its warp sums are written
    if (tid == 0 && q + kGateUpStages < stages) issue(q + kGateUpStages);
    if (tid < n) {
      const float gv = row_total<1>(stage_sums, tid, 0, H);
      const float uv = row_total<1>(stage_sums, g + tid, 0, H);
      act[q * g + tid] = __float2bfloat16_rn(fast_silu(gv) * uv);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 2) down_kernel(MoeBf16BulkParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  float* sums = reinterpret_cast<float*>(smem + kDownStages * kStageBytes);     // [stage][slot]
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + kDownActOffset);  // [top_k][I]
  int32_t* s_expert = reinterpret_cast<int32_t*>(smem + kDownActOffset + kMaxActElems * 2);
  float* s_weight = reinterpret_cast<float*>(s_expert + kMaxTopK);
  const int tid = threadIdx.x, H = p.hidden, I = p.inter, K = p.top_k, t = blockIdx.y;
  const int h0 = int(int64_t(blockIdx.x) * H / gridDim.x);
  const int rows = int(int64_t(blockIdx.x + 1) * H / gridDim.x) - h0;  // ≤ stage_rows(I)
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bar0 = smem0 + kDownActOffset + kMaxActElems * 2 + kMaxTopK * 8;
  init_barriers(bar0, kDownStages);
  pdl_wait();  // gate_up's activations (and the routing before it)
  pdl_launch_dependents();

  if (tid < K) {
    const int e = p.topk_ids[t * K + tid] - p.local_offset;
    s_expert[tid] = e >= 0 && e < p.num_local ? e : -1;
    s_weight[tid] = p.topk_weights[t * K + tid];
  }
  // The token's activation rows, all loads of a thread before its stores.
  {
    constexpr int kBatch = 4;
    const uint4* src = reinterpret_cast<const uint4*>(p.act) + size_t(t) * K * I / 8;
    uint4* dst = reinterpret_cast<uint4*>(xs);
    const int pieces = K * I / 8;
    for (int i0 = tid; i0 < pieces; i0 += kBatch * kThreads) {
      uint4 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (i0 + b * kThreads < pieces) v[b] = src[i0 + b * kThreads];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (i0 + b * kThreads < pieces) dst[i0 + b * kThreads] = v[b];
    }
  }
  __syncthreads();  // ids, weights and activations staged

  // Stage q reads the q-th local choice.
  int local[kMaxTopK], n_local = 0;
  for (int c = 0; c < K; ++c)
    if (s_expert[c] >= 0) local[n_local++] = c;
  const size_t row_bytes = size_t(I) * 2;
  auto issue = [&](int q) {
    const int slot = q % kDownStages;
    const uint32_t bytes = uint32_t(rows) * uint32_t(row_bytes), bar = bar0 + 8 * slot;
    expect_bytes(bar, bytes);
    copy_rows(smem0 + slot * kStageBytes,
              reinterpret_cast<const uint8_t*>(p.down) +
                  (size_t(s_expert[local[q]]) * H + h0) * row_bytes,
              bytes, bar);
  };
  if (tid == 0)
    for (int q = 0; q < kDownStages && q < n_local; ++q) issue(q);

  int piece_row[kPieces], col[kPieces];
  piece_layout(I, piece_row, col);
  float acc = 0.0f;  // thread r < rows: hidden unit h0 + r
  for (int q = 0; q < n_local; ++q) {
    const int slot = q % kDownStages, c = local[q];
    uint4 x[1][kPieces];
#pragma unroll
    for (int j = 0; j < kPieces; ++j)
      x[0][j] = *reinterpret_cast<const uint4*>(xs + size_t(c) * I + col[j]);
    mbarrier::wait(bar0 + 8 * slot, uint32_t(q / kDownStages) & 1u);
    float* stage_sums = sums + slot * kSlots;
    stage_warp_sums<1>(
        smem + slot * kStageBytes, x, piece_row, [&](int r) { return r < rows; }, stage_sums);
    __syncthreads();  // the stage is read and its warp sums are written
    if (tid == 0 && q + kDownStages < n_local) issue(q + kDownStages);
    if (tid < rows) {
      const float y = __bfloat162float(__float2bfloat16_rn(row_total<1>(stage_sums, tid, 0, I)));
      acc += s_weight[c] * y;
    }
  }
  if (tid < rows)
    reinterpret_cast<__nv_bfloat16*>(p.out)[size_t(t) * H + h0 + tid] = __float2bfloat16_rn(acc);
}

}  // namespace

bool moe_bf16_bulk_supported(int num_tokens, int top_k, int hidden, int inter) {
  return num_tokens >= 1 && num_tokens <= kMoeBf16BulkMaxTokens && top_k >= 1 &&
         top_k <= kMaxTopK && hidden > 0 && inter > 0 && hidden % 256 == 0 && inter % 256 == 0 &&
         hidden <= kMaxHidden && inter <= kMaxK && top_k * inter <= kMaxActElems;
}

void moe_bf16_bulk(const MoeBf16BulkParams& p, cudaStream_t stream) {
  if (!moe_bf16_bulk_supported(p.num_tokens, p.top_k, p.hidden, p.inter))
    throw InvalidArgument(
        "moe_bf16_bulk: need 1 <= tokens <= 2, 1 <= top_k <= 8, hidden and "
        "inter multiples of 256, hidden <= " +
        std::to_string(kMaxHidden) + ", inter <= " + std::to_string(kMaxK) +
        " and top_k * inter <= " + std::to_string(kMaxActElems) + " (got " +
        std::to_string(p.num_tokens) + ", " + std::to_string(p.top_k) + ", " +
        std::to_string(p.hidden) + ", " + std::to_string(p.inter) + ")");
  for (const void* ptr : {static_cast<const void*>(p.x), static_cast<const void*>(p.gate_up),
                          static_cast<const void*>(p.down), static_cast<const void*>(p.act),
                          static_cast<const void*>(p.out), static_cast<const void*>(p.topk_ids),
                          static_cast<const void*>(p.topk_weights)})
    if (!is_aligned16(ptr))
      throw InvalidArgument("moe_bf16_bulk: every pointer must be non-null and 16-byte aligned");
  allow_dynamic_smem(gate_up_kernel, kGateUpSmem, "moe_bf16_bulk gate_up");
  allow_dynamic_smem(down_kernel, kDownSmem, "moe_bf16_bulk down");
  const int ctas = sm_count() * kCtasPerSm, pairs = p.num_tokens * p.top_k;
  // gate_up: ~kCtasPerSm CTAs per SM, each with at least one full stage of g channels.
  const int gate_up_spans = std::clamp(ctas / pairs, 1, p.inter / (stage_rows(p.hidden) / 2));
  launch_pdl("moe_bf16_bulk gate_up", gate_up_kernel, dim3(gate_up_spans, pairs), dim3(kThreads),
             kGateUpSmem, stream, p);
  // down: spans of at most one stage of rows.
  const int min_spans = (p.hidden + stage_rows(p.inter) - 1) / stage_rows(p.inter);
  const int down_spans = std::clamp(ctas / p.num_tokens, min_spans, p.hidden);
  launch_pdl("moe_bf16_bulk down", down_kernel, dim3(down_spans, p.num_tokens), dim3(kThreads),
             kDownSmem, stream, p);
}

}  // namespace serval::kernels::cuda
