// MoE routing kernels: warp-per-token top-k (each round two 32-bit warp reductions: the best
// score, then the lowest expert holding it), then one CTA that builds the per-expert histogram,
// the tile-padded scan and the permutation maps. Up to kSmallMaxTokens tokens one small CTA does
// everything in shared memory (few_tokens_kernel); up to kFusedMaxTokens one 1024-thread CTA.
#include "kernels/cuda/moe/moe_routing.h"

#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kPerLane = kMoeMaxExperts / 32;
constexpr int kMapThreads = 1024;
// At or below this many tokens one CTA does top-k and maps in a single launch.
constexpr int kFusedMaxTokens = 128;
// At or below this many tokens (one warp each) few_tokens_kernel does it with one thread per
// pair and per local expert.
constexpr int kSmallThreads = 256;
constexpr int kSmallMaxTokens = kSmallThreads / 32;
static_assert(kSmallThreads >= kMoeMaxExperts &&
                  kSmallMaxTokens * kMoeMaxTopK <= kSmallThreads * 32,
              "few_tokens_kernel: one thread per local expert");

// Monotone map of a float onto uint32 (larger float → larger integer).
__device__ __forceinline__ uint32_t orderable(float f) {
  uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Key (score, index): larger score first, then the lower index. 0 is "no candidate": every real
// key is larger because its high word is ≥ orderable(-inf) > 0.
__device__ __forceinline__ uint64_t make_key(float v, int idx) {
  return (uint64_t(orderable(v)) << 32) | uint64_t(0xffffffffu - uint32_t(idx));
}

__device__ __forceinline__ int key_index(uint64_t key) {
  return int(0xffffffffu - uint32_t(key & 0xffffffffu));
}

__device__ __forceinline__ uint64_t warp_max_key(uint64_t k) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    uint64_t o = __shfl_xor_sync(kFull, k, off);
    k = o > k ? o : k;
  }
  return k;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// Inverse of orderable().
__device__ __forceinline__ float ord_value(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

// Candidates of one lane: expert i·32 + lane has score ord[i] (orderable) when bit i of `alive`
// is set. The best candidate of the warp is the one make_key orders first: the largest score,
// then the lowest expert index; found with two single-instruction warp reductions instead of a
// 64-bit shuffle tree.
struct Candidates {
  uint32_t ord[kPerLane];
  uint32_t alive = 0;
};

struct Top {
  uint32_t ord;  // orderable score
  int index;     // expert
};

__device__ __forceinline__ Top warp_top(const Candidates& c, int lane) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if ((c.alive >> i) & 1u) m = max(m, c.ord[i]);
  m = __reduce_max_sync(kFull, m);
  uint32_t idx = 0xffffffffu;
#pragma unroll
  for (int i = kPerLane - 1; i >= 0; --i)
    if (((c.alive >> i) & 1u) && c.ord[i] == m) idx = uint32_t(i * 32 + lane);
  idx = __reduce_min_sync(kFull, idx);
  return {m, int(idx)};
}

// Removes expert `e` from the candidates (only its owning lane holds it).
__device__ __forceinline__ void drop(Candidates& c, int e, int lane) {
  if ((e & 31) == lane) c.alive &= ~(1u << (e >> 5));
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// One warp routes token t; lane j < top_k writes choice j and returns its expert (other lanes
// return 0). Mirrors kernels::cpu::route.
__device__ int route_token_warp(const MoeRoutingParams& p, int t, int lane) {
  const int E = p.num_experts, k = p.top_k;
  const float* row = p.logits + size_t(t) * E;
  float vals[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    int e = i * 32 + lane;
    vals[i] = e < E ? row[e] : -INFINITY;
  }
  Candidates cand;
  float softmax_max = 0.0f, softmax_sum = 1.0f;
  const bool grouped = p.method == RoutingMethod::kSigmoidGroupedTopK;
  if (grouped) {
    float biased[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      int e = i * 32 + lane;
      biased[i] =
          e < E ? sigmoid(vals[i]) + (p.correction_bias ? p.correction_bias[e] : 0.0f) : -INFINITY;
    }
    const int group_size = E / p.num_groups;
    // Lane g holds the score of group g: sum of its top-2 biased scores (top-1 if size 1).
    float group_score = -INFINITY;
    for (int g = 0; g < p.num_groups; ++g) {
      Candidates members;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        int e = i * 32 + lane;
        members.ord[i] = orderable(biased[i]);
        if (e < E && e / group_size == g) members.alive |= 1u << i;
      }
      const Top b1 = warp_top(members, lane);
      float s = 0.0f + ord_value(b1.ord);
      if (group_size >= 2) {
        drop(members, b1.index, lane);
        s += ord_value(warp_top(members, lane).ord);
      }
      if (lane == g) group_score = s;
    }
    uint64_t gkey = lane < p.num_groups ? make_key(group_score, lane) : 0;
    bool selected = false;
    for (int r = 0; r < p.topk_groups; ++r) {
      uint64_t best = warp_max_key(gkey);
      if (key_index(best) == lane) {
        selected = true;
        gkey = 0;
      }
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      int e = i * 32 + lane;
      int g = e < E ? e / group_size : 0;
      bool in = __shfl_sync(kFull, selected ? 1 : 0, g & 31) != 0;
      cand.ord[i] = orderable(in ? biased[i] : -INFINITY);
      if (e < E) cand.alive |= 1u << i;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      int e = i * 32 + lane;
      cand.ord[i] = orderable(vals[i]);
      if (e < E) cand.alive |= 1u << i;
    }
    if (p.method == RoutingMethod::kSoftmaxTopK) {
      float m = -INFINITY;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) m = fmaxf(m, vals[i]);
      softmax_max = warp_max(m);
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (i * 32 + lane < E) s += expf(vals[i] - softmax_max);
      softmax_sum = warp_sum(s);
    }
  }

  int my_id = 0;
  uint32_t my_ord = 0;
  for (int r = 0; r < k; ++r) {
    const Top best = warp_top(cand, lane);
    if (lane == r) {
      my_id = best.index;
      my_ord = best.ord;
    }
    drop(cand, best.index, lane);
  }

  const bool active = lane < k;
  // The selection score is the logit itself except for the grouped method (biased sigmoid).
  const float l = !active ? 0.0f : grouped ? row[my_id] : ord_value(my_ord);
  float w = 0.0f;
  switch (p.method) {
    case RoutingMethod::kSoftmaxTopK:
      w = expf(l - softmax_max) / softmax_sum;
      break;
    case RoutingMethod::kTopKSoftmax: {
      float m0 = __shfl_sync(kFull, l, 0);  // choice 0 has the largest logit
      float ex = active ? expf(l - m0) : 0.0f;
      w = ex / warp_sum(ex);
      break;
    }
    case RoutingMethod::kSigmoidGroupedTopK:
      w = sigmoid(l);  // the bias only selects
      break;
  }
  if (p.renormalize && p.method != RoutingMethod::kTopKSoftmax) {
    float sum = warp_sum(active ? w : 0.0f);
    float eps = p.method == RoutingMethod::kSigmoidGroupedTopK ? 1e-20f : 0.0f;
    w = w / (sum + eps);
  }
  if (active) {
    p.topk_ids[size_t(t) * k + lane] = my_id;
    p.topk_weights[size_t(t) * k + lane] = w * p.routed_scaling_factor;
  }
  return active ? my_id : 0;
}

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

// Few tokens (≤ kSmallMaxTokens): one CTA of kSmallThreads; warp t routes token t, then thread i
// owns pair i and thread e local expert e, all exchanges in shared memory (no global read-back):
//   1. routing; pair i's local expert → s_local,
//   2. rank of pair i among the pairs of its warp with the same expert (match_any) and, per warp,
//      each expert's pair count,
//   3. thread e: count and per-warp exclusive prefix (in place), tiles, block scan → offsets;
//      tile_expert and the expert's padding rows (disjoint from every valid row),
//   4. pair i: row = offset·tile + earlier warps' pairs of its expert + its rank.
// Ranks follow pair order, so the maps are deterministic.
__global__ void __launch_bounds__(kSmallThreads) few_tokens_kernel(MoeRoutingParams p) {
  constexpr int kWarps = kSmallThreads / 32;
  __shared__ int s_local[kSmallThreads];
  __shared__ int s_warp_count[kWarps][kMoeMaxExperts];
  __shared__ int s_offset[kMoeMaxExperts];
  __shared__ int s_scan[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  pdl_wait();
  pdl_launch_dependents();
  const int k = p.top_k, pairs = p.num_tokens * k, pair_warps = (pairs + 31) / 32;
  if (tid < p.num_local)
    for (int w = 0; w < pair_warps; ++w) s_warp_count[w][tid] = 0;
  if (warp < p.num_tokens) {
    const int id = route_token_warp(p, warp, lane);
    const int local = id - p.local_offset;
    if (lane < k) s_local[warp * k + lane] = local >= 0 && local < p.num_local ? local : -1;
  }
  __syncthreads();

  const int local = tid < pairs ? s_local[tid] : -1;
  int rank = 0;
  if (warp < pair_warps) {  // warp-uniform
    const unsigned same = __match_any_sync(kFull, local);
    rank = __popc(same & ((1u << lane) - 1u));
    if (local >= 0 && rank == 0) s_warp_count[warp][local] = __popc(same);
  }
  __syncthreads();

  const int e = tid;
  int count = 0, tiles = 0;
  if (e < p.num_local) {
    for (int w = 0; w < pair_warps; ++w) {
      const int c = s_warp_count[w][e];
      s_warp_count[w][e] = count;
      count += c;
    }
    tiles = (count + p.tile - 1) / p.tile;
  }
  int incl = tiles;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) s_scan[warp] = incl;
  __syncthreads();
  int before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int v = s_scan[w];
    before += w < warp ? v : 0;
    total += v;
  }
  if (e < p.num_local) {
    const int first = before + incl - tiles;
    s_offset[e] = first;
    for (int c = first; c < first + tiles; ++c) p.tile_expert[c] = e;
    for (int r = first * p.tile + count; r < (first + tiles) * p.tile; ++r)
      p.permuted_to_token[r] = -1;
  }
  if (tid == 0) *p.num_tiles = total;
  __syncthreads();

  if (tid < pairs) {
    int row = -1;
    if (local >= 0) {
      row = s_offset[local] * p.tile + s_warp_count[warp][local] + rank;
      p.permuted_to_token[row] = tid / k;
    }
    p.expanded_to_permuted[tid] = row;
  }
}

void check_params(const MoeRoutingParams& p) {
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

}  // namespace

void moe_routing(const MoeRoutingParams& p, cudaStream_t stream) {
  check_params(p);
  if (p.num_tokens <= kSmallMaxTokens) {
    launch_pdl("moe_routing (few tokens)", few_tokens_kernel, dim3(1), dim3(kSmallThreads), 0,
               stream, p);
    return;
  }
  if (p.num_tokens <= kFusedMaxTokens) {
    launch_pdl("moe_routing (fused)", maps_kernel<true>, dim3(1), dim3(kMapThreads), 0, stream, p);
    return;
  }
  constexpr int kWarps = 8;
  launch_pdl("moe_routing (top-k)", topk_kernel,
             dim3(unsigned((p.num_tokens + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0, stream, p);
  launch_pdl("moe_routing (maps)", maps_kernel<false>, dim3(1), dim3(kMapThreads), 0, stream, p);
}

void moe_routing_single_cta(const MoeRoutingParams& p, cudaStream_t stream) {
  check_params(p);
  if (p.num_tokens > kFusedMaxTokens)
    throw InvalidArgument("moe_routing_single_cta: at most " + std::to_string(kFusedMaxTokens) +
                          " tokens (got " + std::to_string(p.num_tokens) + ")");
  launch_pdl("moe_routing (fused)", maps_kernel<true>, dim3(1), dim3(kMapThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
