// Device code of the MoE routing shared by the routing kernels (moe_routing.cu) and the fused
// residual add + RMSNorm + router GEMV + routing kernel (moe_norm_router.cu): warp-per-token
// top-k and the few-token map builder. Included only by .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/moe/moe_routing.h"

namespace serval::kernels::cuda::routing {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kPerLane = kMoeMaxExperts / 32;
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

// The k ≤ 32 best candidates of the warp in make_key order (larger score, then lower expert):
// lane r < k gets the r-th one's expert and orderable score in `id` / `ord` (other lanes keep
// theirs). What k rounds of warp_top + drop select, but each lane sorts its own candidates once
// (a 19-comparator network, best first; missing experts last, as (0, 0xffffffff)), so that a
// round is two warp reductions over the lanes' heads and a shift in the winning lane instead of
// a scan of every candidate: the top-k loop was ~75 instructions per round, on the critical path
// of the kernels that route a token in each CTA (ncu, Qwen3-30B NVFP4 gate_up at one token).
__device__ __forceinline__ void warp_top_k(const Candidates& c, int k, int lane, int& id,
                                           uint32_t& ord) {
  static_assert(kPerLane == 8, "the sorting network below is for 8 candidates per lane");
  uint32_t o[kPerLane], x[kPerLane];  // orderable score, expert
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const bool alive = (c.alive >> i) & 1u;
    o[i] = alive ? c.ord[i] : 0u;
    x[i] = alive ? uint32_t(i * 32 + lane) : 0xffffffffu;
  }
  auto order = [&](int a, int b) {  // a before b in make_key order
    const bool swap = o[b] > o[a] || (o[b] == o[a] && x[b] < x[a]);
    const uint32_t oa = o[a], xa = x[a];
    o[a] = swap ? o[b] : oa;
    x[a] = swap ? x[b] : xa;
    o[b] = swap ? oa : o[b];
    x[b] = swap ? xa : x[b];
  };
  constexpr int kNetwork[19][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {0, 4}, {1, 5}, {2, 6},
                                   {3, 7}, {0, 1}, {2, 3}, {4, 5}, {6, 7}, {2, 4}, {3, 5},
                                   {1, 4}, {3, 6}, {1, 2}, {3, 4}, {5, 6}};
#pragma unroll
  for (const auto& pair : kNetwork) order(pair[0], pair[1]);
  for (int r = 0; r < k; ++r) {
    const uint32_t m = __reduce_max_sync(kFull, o[0]);
    const uint32_t best = __reduce_min_sync(kFull, o[0] == m ? x[0] : 0xffffffffu);
    if (lane == r) {
      id = int(best);
      ord = m;
    }
    if (x[0] == best) {  // this lane's head was taken (missing experts are never the best)
#pragma unroll
      for (int i = 0; i + 1 < kPerLane; ++i) {
        o[i] = o[i + 1];
        x[i] = x[i + 1];
      }
      o[kPerLane - 1] = 0u;
      x[kPerLane - 1] = 0xffffffffu;
    }
  }
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// One warp routes token t; lane j < top_k writes choice j and returns its expert (other lanes
// return 0). Mirrors kernels::cpu::route. The logits are read with plain loads: in the fused
// norm + router kernel other CTAs of the running grid wrote them, and the caller's acquire fence
// (after the arrival atomic) makes them visible (__ldcg here cost the routing kernels registers
// and a spill).
__device__ __forceinline__ int route_token_warp(const MoeRoutingParams& p, int t, int lane) {
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
  warp_top_k(cand, k, lane, my_id, my_ord);

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

// Few tokens (≤ kSmallMaxTokens): one CTA of kSmallThreads; warp t routes token t, then thread i
// owns pair i and thread e local expert e, all exchanges in shared memory (no global read-back):
//   1. routing; pair i's local expert → s_local,
//   2. rank of pair i among the pairs of its warp with the same expert (match_any) and, per warp,
//      each expert's pair count,
//   3. thread e: count and per-warp exclusive prefix (in place), tiles, block scan → offsets;
//      tile_expert and the expert's padding rows (disjoint from every valid row),
//   4. pair i: row = offset·tile + earlier warps' pairs of its expert + its rank.
// Ranks follow pair order, so the maps are deterministic. Called by all kSmallThreads threads of
// a CTA of exactly that size with p.num_tokens ≤ kSmallMaxTokens, after the PDL wait; contains
// __syncthreads (and static shared memory: ~10 KB).
__device__ __forceinline__ void few_tokens_routing(const MoeRoutingParams& p) {
  constexpr int kWarps = kSmallThreads / 32;
  __shared__ int s_local[kSmallThreads];
  __shared__ int s_warp_count[kWarps][kMoeMaxExperts];
  __shared__ int s_offset[kMoeMaxExperts];
  __shared__ int s_scan[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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

// Token t's routing inside a consumer CTA (the expert kernels that route a token themselves):
// warp 0 copies the token's logits ([*, num_experts] fp32, written by another grid: read through
// L2) into shared `row` and routes them with route_token_warp into shared `ids` / `weights`
// (top_k each); `params` gives the method, sizes, local slice and scaling (its pointers are not
// used). Called by every thread of the CTA; ends with __syncthreads.
__device__ __forceinline__ void route_in_cta(const float* logits, const MoeRoutingParams& params,
                                             int t, float* row, int32_t* ids, float* weights) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, E = params.num_experts;
    // Every load in flight before the first store: one L2 round trip, not one per 32 experts
    // (the loop over experts with a store in it had waited for each load in turn).
    const float* src = logits + size_t(t) * E;
    float v[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      v[i] = i * 32 + lane < E ? __ldcg(src + i * 32 + lane) : 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (i * 32 + lane < E) row[i * 32 + lane] = v[i];
    __syncwarp();
    MoeRoutingParams rp = params;
    rp.logits = row;
    rp.topk_ids = ids;
    rp.topk_weights = weights;
    route_token_warp(rp, 0, lane);
  }
  __syncthreads();
}

}  // namespace serval::kernels::cuda::routing
