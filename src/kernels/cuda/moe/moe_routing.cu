// MoE routing kernels: warp-per-token top-k (each round two 32-bit warp reductions: the best
// score, then the lowest expert holding it), then the per-expert histogram, the tile-padded scan
// and the permutation maps, built by one CTA or, from kMoeChunkedMapsMinTokens tokens, by two
// multi-CTA kernels over chunks of the pairs. Up to kSmallMaxTokens tokens one small CTA does
// everything in shared memory (few_tokens_kernel). Above that the top-k runs over many CTAs
// before the map kernel: one 1024-thread CTA doing the top-k too (moe_routing_single_cta, up to
// kSingleCtaMaxTokens) took, on the H200, 5.8 / 8.7 / 15.0 / 27.5 µs at 16 / 32 / 64 / 128
// tokens, against 5.1 / 5.2 / 5.5 / 6.1 µs for the two kernels (MoeSmallKernelsBench).
#include "kernels/cuda/moe/moe_routing.h"

#include <cuda_runtime.h>

#include <algorithm>
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

// The multi-CTA map builder: the pairs fall into `chunks` runs of chunk_pairs (the last may be
// shorter), one CTA of kChunkThreads each, in two kernels. One 1024-thread CTA took 100 µs for
// the 65536 pairs of 8192 Qwen3 tokens on the H200 (its loops wait on one load at a time).
constexpr int kChunkThreads = 256;
constexpr int kChunkBatch = 4;  // pairs a thread loads before it uses any
constexpr int kChunkMinPairs = kChunkThreads * kChunkBatch;
static_assert(kChunkThreads >= kMoeMaxExperts, "one thread per local expert");

struct Chunks {
  int chunks, chunk_pairs;
};
Chunks chunks_for(int pairs) {
  const int chunks = std::clamp((pairs + kChunkMinPairs - 1) / kChunkMinPairs, 1, kMoeMaxMapChunks);
  return {chunks, (pairs + chunks - 1) / chunks};
}

// Pairs [begin, end) of CTA blockIdx.x's chunk.
struct ChunkRange {
  int begin, end;
};
__device__ __forceinline__ ChunkRange chunk_range(const MoeRoutingParams& p, int chunk_pairs) {
  const int begin = int(blockIdx.x) * chunk_pairs;
  return {begin, min(begin + chunk_pairs, p.num_tokens * p.top_k)};
}

// Kernel 1: the chunk's count per local expert → chunk_counts[chunk][e], and each pair's rank
// among the chunk's pairs of its expert → expanded_to_permuted (−1 outside the slice). Ranks come
// from shared atomics, in no fixed order: each permuted row is computed on its own, so results do
// not depend on it.
__global__ void __launch_bounds__(kChunkThreads)
    chunk_count_kernel(MoeRoutingParams p, int chunk_pairs) {
  __shared__ int counts[kMoeMaxExperts];
  const int tid = threadIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  if (tid < p.num_local) counts[tid] = 0;
  __syncthreads();
  const ChunkRange r = chunk_range(p, chunk_pairs);
  for (int i0 = r.begin + tid; i0 < r.end; i0 += kChunkThreads * kChunkBatch) {
    int local[kChunkBatch];
#pragma unroll
    for (int j = 0; j < kChunkBatch; ++j) {
      const int i = i0 + j * kChunkThreads;
      local[j] = i < r.end ? p.topk_ids[i] - p.local_offset : -1;
    }
#pragma unroll
    for (int j = 0; j < kChunkBatch; ++j) {
      const int i = i0 + j * kChunkThreads;
      const bool mine = local[j] >= 0 && local[j] < p.num_local;
      if (i < r.end) p.expanded_to_permuted[i] = mine ? atomicAdd(&counts[local[j]], 1) : -1;
    }
  }
  __syncthreads();
  if (tid < p.num_local) p.chunk_counts[blockIdx.x * p.num_local + tid] = counts[tid];
}

// Kernel 2: every CTA sums the chunk counts (thread e: expert e's total and the part of the chunks
// before its own), scans the tiles per expert, and places its chunk's pairs: row = the expert's
// first row + the earlier chunks' pairs of the expert + the rank. Each warp of the grid also
// writes tile_expert and the padding rows (−1) of some experts; CTA 0 writes num_tiles.
__global__ void __launch_bounds__(kChunkThreads)
    chunk_scatter_kernel(MoeRoutingParams p, int chunks, int chunk_pairs) {
  __shared__ int tile_off[kMoeMaxExperts + 1];  // first tile per expert; [num_local]: all tiles
  __shared__ int row_base[kMoeMaxExperts];      // first row of this chunk's pairs, per expert
  __shared__ int total_pairs[kMoeMaxExperts];
  __shared__ int warp_tiles[kChunkThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  pdl_wait();
  pdl_launch_dependents();
  int total = 0, before = 0;
  if (tid < p.num_local) {
    const int32_t* col = p.chunk_counts + tid;
#pragma unroll 8
    for (int c = 0; c < chunks; ++c) {
      const int v = col[c * p.num_local];
      total += v;
      before += c < int(blockIdx.x) ? v : 0;
    }
  }
  const int tiles = (total + p.tile - 1) / p.tile;
  int incl = tiles;  // inclusive scan over the warp, then over the warps
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_tiles[warp] = incl;
  __syncthreads();
  for (int w = 0; w < warp; ++w) incl += warp_tiles[w];
  if (tid < p.num_local) {
    tile_off[tid] = incl - tiles;
    row_base[tid] = (incl - tiles) * p.tile + before;
    total_pairs[tid] = total;
  }
  if (tid == kChunkThreads - 1) tile_off[p.num_local] = incl;  // threads ≥ num_local add 0
  __syncthreads();

  const ChunkRange r = chunk_range(p, chunk_pairs);
  for (int i0 = r.begin + tid; i0 < r.end; i0 += kChunkThreads * kChunkBatch) {
    int rank[kChunkBatch], local[kChunkBatch];
#pragma unroll
    for (int j = 0; j < kChunkBatch; ++j) {
      const int i = i0 + j * kChunkThreads;
      rank[j] = i < r.end ? p.expanded_to_permuted[i] : -1;
      local[j] = i < r.end ? p.topk_ids[i] - p.local_offset : 0;
    }
#pragma unroll
    for (int j = 0; j < kChunkBatch; ++j) {
      if (rank[j] < 0) continue;  // past the chunk, or outside the slice (stays −1)
      const int i = i0 + j * kChunkThreads, row = row_base[local[j]] + rank[j];
      p.expanded_to_permuted[i] = row;
      p.permuted_to_token[row] = i / p.top_k;
    }
  }
  // Expert e's tiles and padding rows go to warp e mod (all warps of the grid): one expert after
  // another per CTA cost ~0.2 µs each (dependent shared loads and loop set-up), 28 µs for 128
  // experts in one chunk.
  constexpr int kWarps = kChunkThreads / 32;
  for (int e = int(blockIdx.x) * kWarps + warp; e < p.num_local; e += chunks * kWarps) {
    const int t0 = tile_off[e], t1 = tile_off[e + 1];
    for (int t = t0 + lane; t < t1; t += 32) p.tile_expert[t] = e;
    for (int row = t0 * p.tile + total_pairs[e] + lane; row < t1 * p.tile; row += 32)
      p.permuted_to_token[row] = -1;
  }
  if (blockIdx.x == 0 && tid == 0) *p.num_tiles = tile_off[p.num_local];
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

void moe_routing(const MoeRoutingParams& p, cudaStream_t stream, MoeMapsKernel maps) {
  moe_routing_check(p);
  if (maps == MoeMapsKernel::kChunked && p.chunk_counts == nullptr)
    throw InvalidArgument("moe_routing: the multi-CTA map kernels need chunk_counts");
  if (p.num_tokens <= kSmallMaxTokens) {
    launch_pdl("moe_routing (few tokens)", few_tokens_kernel, dim3(1), dim3(kSmallThreads), 0,
               stream, p);
    return;
  }
  constexpr int kWarps = 8;
  launch_pdl("moe_routing (top-k)", topk_kernel,
             dim3(unsigned((p.num_tokens + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0, stream, p);
  const bool chunked = maps == MoeMapsKernel::kChunked ||
                       (maps == MoeMapsKernel::kAuto && p.chunk_counts != nullptr &&
                        p.num_tokens >= kMoeChunkedMapsMinTokens);
  if (!chunked) {
    launch_pdl("moe_routing (maps)", maps_kernel<false>, dim3(1), dim3(kMapThreads), 0, stream, p);
    return;
  }
  const Chunks c = chunks_for(p.num_tokens * p.top_k);
  launch_pdl("moe_routing (chunk counts)", chunk_count_kernel, dim3(unsigned(c.chunks)),
             dim3(kChunkThreads), 0, stream, p, c.chunk_pairs);
  launch_pdl("moe_routing (chunk scatter)", chunk_scatter_kernel, dim3(unsigned(c.chunks)),
             dim3(kChunkThreads), 0, stream, p, c.chunks, c.chunk_pairs);
}

void moe_routing_single_cta(const MoeRoutingParams& p, cudaStream_t stream) {
  moe_routing_check(p);
  if (p.num_tokens > kSingleCtaMaxTokens)
    throw InvalidArgument("moe_routing_single_cta: at most " + std::to_string(kSingleCtaMaxTokens) +
                          " tokens (got " + std::to_string(p.num_tokens) + ")");
  launch_pdl("moe_routing (fused)", maps_kernel<true>, dim3(1), dim3(kMapThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
