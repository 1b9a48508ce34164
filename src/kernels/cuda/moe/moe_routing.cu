// MoE routing kernels: warp-per-token top-k (each round two 32-bit warp reductions: the best
// score, then the lowest expert holding it), then one CTA that builds the per-expert histogram,
// the tile-padded scan and the permutation maps. Up to kSmallMaxTokens tokens one small CTA does
// everything in shared memory (few_tokens_kernel). Above that the top-k runs over many CTAs
// before the map kernel: one 1024-thread CTA doing the top-k too (moe_routing_single_cta, up to
// kSingleCtaMaxTokens) took, on the H200, 5.8 / 8.7 / 15.0 / 27.5 µs at 16 / 32 / 64 / 128
// tokens, against 5.1 / 5.2 / 5.5 / 6.1 µs for the two kernels (MoeSmallKernelsBench).
#include "kernels/cuda/moe/moe_routing.h"

#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/moe/moe_routing_device.cuh"

namespace serval::kernels::cuda {

namespace {

using routing::kFull;
using routing::kSmallMaxTokens;
using routing::kSmallThreads;
using routing::route_token_warp;
constexpr int kMapThreads = 1024;
// moe_routing_single_cta's limit.
constexpr int kSingleCtaMaxTokens = 128;

// PDL: every routing kernel waits for its predecessor (the router GEMM writes the logits, or
// the top-k kernel the ids) and then lets its successor launch at once; the successor waits for
// this grid's completion before reading anything it writes.
__global__ void __launch_bounds__(256) topk_kernel(MoeRoutingParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t < p.num_tokens) route_token_warp(p, t, lane);
}

// One CTA of kMapThreads threads. With kTopK it first routes every token (warp per token).
// Phases (each ends at a barrier every thread reaches):
//   1. histogram with a rank per pair (shared atomics; rank order is not deterministic, but
//      each permuted row is computed independently, so results are),
//   2. warp-0 scan of ceil(count / tile) → tile offsets, num_tiles,
//   3. padding rows ← −1, tile_expert,
//   4. scatter: expanded → permuted row, permuted row → token.
template <bool kTopK>
__global__ void __launch_bounds__(kMapThreads) maps_kernel(MoeRoutingParams p) {
  __shared__ int counts[kMoeMaxExperts];
  __shared__ int offsets[kMoeMaxExperts + 1];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  pdl_wait();
  pdl_launch_dependents();
  if constexpr (kTopK) {
    for (int t = warp; t < p.num_tokens; t += kMapThreads / 32) route_token_warp(p, t, lane);
  }
  for (int e = tid; e < p.num_local; e += kMapThreads) counts[e] = 0;
  __syncthreads();

  const int pairs = p.num_tokens * p.top_k;
  for (int i = tid; i < pairs; i += kMapThreads) {
    int local = p.topk_ids[i] - p.local_offset;
    int rank = -1;
    if (local >= 0 && local < p.num_local) rank = atomicAdd(&counts[local], 1);
    p.expanded_to_permuted[i] = rank;
  }
  __syncthreads();

  if (warp == 0) {
    const int per = (p.num_local + 31) / 32;
    const int begin = min(lane * per, p.num_local), end = min(begin + per, p.num_local);
    int sum = 0;
    for (int e = begin; e < end; ++e) sum += (counts[e] + p.tile - 1) / p.tile;
    int incl = sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      int v = __shfl_up_sync(kFull, incl, off);
      if (lane >= off) incl += v;
    }
    int run = incl - sum;
    for (int e = begin; e < end; ++e) {
      offsets[e] = run;
      run += (counts[e] + p.tile - 1) / p.tile;
    }
    if (lane == 31) {
      offsets[p.num_local] = incl;
      *p.num_tiles = incl;
    }
  }
  __syncthreads();

  const int total_rows = offsets[p.num_local] * p.tile;
  for (int r = tid; r < total_rows; r += kMapThreads) p.permuted_to_token[r] = -1;
  for (int e = tid; e < p.num_local; e += kMapThreads)
    for (int c = offsets[e]; c < offsets[e + 1]; ++c) p.tile_expert[c] = e;
  __syncthreads();

  for (int i = tid; i < pairs; i += kMapThreads) {
    int rank = p.expanded_to_permuted[i];
    if (rank < 0) continue;
    int local = p.topk_ids[i] - p.local_offset;
    int row = offsets[local] * p.tile + rank;
    p.expanded_to_permuted[i] = row;
    p.permuted_to_token[row] = i / p.top_k;
  }
}

// Few tokens (≤ kSmallMaxTokens): one CTA of kSmallThreads runs routing::few_tokens_routing.
__global__ void __launch_bounds__(kSmallThreads) few_tokens_kernel(MoeRoutingParams p) {
  pdl_wait();
  pdl_launch_dependents();
  routing::few_tokens_routing(p);
}

}  // namespace

void moe_routing_check(const MoeRoutingParams& p) {
  if (p.num_experts < 1 || p.num_experts > kMoeMaxExperts || p.top_k < 1 || p.top_k > kMoeMaxTopK ||
      p.top_k > p.num_experts || p.num_local < 0 || p.num_local > kMoeMaxExperts || p.tile < 1 ||
      p.num_tokens < 0)
    throw InvalidArgument("moe_routing: need 1 ≤ top_k ≤ min(32, num_experts), num_experts ≤ " +
                          std::to_string(kMoeMaxExperts) + ", num_local ≤ 256, tile ≥ 1 (got E=" +
                          std::to_string(p.num_experts) + ", k=" + std::to_string(p.top_k) + ")");
  if (p.method == RoutingMethod::kSigmoidGroupedTopK &&
      (p.num_groups < 1 || p.num_groups > 32 || p.num_experts % p.num_groups != 0 ||
       p.topk_groups < 1 || p.topk_groups > p.num_groups))
    throw InvalidArgument(
        "moe_routing: grouped top-k needs 1 ≤ topk_groups ≤ num_groups ≤ 32 "
        "and num_experts divisible by num_groups");
}

void moe_routing(const MoeRoutingParams& p, cudaStream_t stream) {
  moe_routing_check(p);
  if (p.num_tokens <= kSmallMaxTokens) {
    launch_pdl("moe_routing (few tokens)", few_tokens_kernel, dim3(1), dim3(kSmallThreads), 0,
               stream, p);
    return;
  }
  constexpr int kWarps = 8;
  launch_pdl("moe_routing (top-k)", topk_kernel,
             dim3(unsigned((p.num_tokens + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0, stream, p);
  launch_pdl("moe_routing (maps)", maps_kernel<false>, dim3(1), dim3(kMapThreads), 0, stream, p);
}

void moe_routing_single_cta(const MoeRoutingParams& p, cudaStream_t stream) {
  moe_routing_check(p);
  if (p.num_tokens > kSingleCtaMaxTokens)
    throw InvalidArgument("moe_routing_single_cta: at most " + std::to_string(kSingleCtaMaxTokens) +
                          " tokens (got " + std::to_string(p.num_tokens) + ")");
  launch_pdl("moe_routing (fused)", maps_kernel<true>, dim3(1), dim3(kMapThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
