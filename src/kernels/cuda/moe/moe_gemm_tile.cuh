// The start of every grouped-GEMM CTA (moe_gemm.cu, moe_gemm_wgmma.cu): which expert its token
// tile belongs to, under the PDL protocol of the two GEMMs.
#pragma once
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/moe/moe_gemm.h"
#include "kernels/cuda/moe/moe_routing_device.cuh"

namespace serval::kernels::cuda {

// The expert of token tile `tile`, or −1 when the tile lies past *num_tiles: the CTA must then
// return at once (before any barrier). PDL: GEMM1 follows the routing kernel, so it waits before
// reading the maps and then lets GEMM2 launch at once. GEMM2 reads the maps (tile_expert,
// num_tiles) BEFORE its own wait: it is launched only after every GEMM1 CTA has passed pdl_wait
// (trigger after the wait, or exit after the wait), so the routing grid has completed and
// flushed by then; the L2-only loads (ld.global.cg) cannot hit a stale L1 line. That lets GEMM2
// stream its first weight stages into shared memory while GEMM1 finishes; it must call pdl_wait
// before reading GEMM1's output. Every CTA waits before it exits (pdl.cuh contract).
template <bool kGemm1>
__device__ __forceinline__ int moe_tile_expert(const MoeGemmParams& p, int tile) {
  if constexpr (kGemm1) pdl_wait();
  const int num_tiles = kGemm1 ? *p.num_tiles : __ldcg(p.num_tiles);
  if (tile >= num_tiles) {
    if constexpr (!kGemm1) pdl_wait();
    return -1;
  }
  const int expert = kGemm1 ? p.tile_expert[tile] : __ldcg(p.tile_expert + tile);
  if constexpr (kGemm1) pdl_launch_dependents();
  return expert;
}

// moe_tile_expert for MoeGemmParams::route_logits (one token): the CTA routes the token itself
// (routing::route_in_cta, warp 0) and takes the local choice of rank `tile` in expert order. PDL:
// GEMM1 waits first (the logits come from the kernel before); GEMM2 routes before its own wait
// (the logits' kernel completed before GEMM1 let GEMM2 launch) and waits before returning −1.
// CTA (0, 0) of GEMM1 stores the routing as moe_routing would for the finalize: ids, weights,
// expanded_to_permuted (choice j → row rank·tile, −1 when not local) and the maps. Every thread
// calls it once, first; it contains __syncthreads.
template <bool kGemm1>
__device__ __forceinline__ int moe_routed_tile_expert(const MoeGemmParams& p, int tile) {
  __shared__ float s_row[kMoeMaxExperts];
  __shared__ int32_t s_ids[kMoeMaxTopK];
  __shared__ float s_weights[kMoeMaxTopK];
  if constexpr (kGemm1) pdl_wait();
  routing::route_in_cta(p.route_logits, p.route, 0, s_row, s_ids, s_weights);
  const MoeRoutingParams& r = p.route;
  const int k = r.top_k;
  auto local_of = [&](int j) {
    const int e = s_ids[j] - r.local_offset;
    return e >= 0 && e < r.num_local ? e : -1;
  };
  // Rank of a local expert among the token's local choices (distinct: one token).
  auto rank_of = [&](int e) {
    int rank = 0;
    for (int i = 0; i < k; ++i) {
      const int o = local_of(i);
      rank += o >= 0 && o < e ? 1 : 0;
    }
    return rank;
  };
  int expert = -1, num_tiles = 0;
  for (int j = 0; j < k; ++j) {
    const int e = local_of(j);
    if (e < 0) continue;
    if (rank_of(e) == tile) expert = e;
    ++num_tiles;
  }
  if (kGemm1 && blockIdx.x == 0 && tile == 0) {
    const int j = threadIdx.x;
    if (j < k) {
      const int e = local_of(j), rank = e >= 0 ? rank_of(e) : -1;
      r.topk_ids[j] = s_ids[j];
      r.topk_weights[j] = s_weights[j];
      r.expanded_to_permuted[j] = e >= 0 ? rank * r.tile : -1;
      if (e >= 0) {
        r.tile_expert[rank] = e;
        for (int q = 0; q < r.tile; ++q) r.permuted_to_token[rank * r.tile + q] = q == 0 ? 0 : -1;
      }
    }
    if (j == 0) *r.num_tiles = num_tiles;
  }
  if (expert < 0) {
    if constexpr (!kGemm1) pdl_wait();
    return -1;
  }
  if constexpr (kGemm1) pdl_launch_dependents();
  return expert;
}

// Persistent grouped GEMMs (moe_gemm_wgmma_ws.cu, moe_gemm_wgmma_nvfp4.cu), whose CTAs walk work
// items (weight block, token tile): the number of items, *num_tiles · m_blocks, under the PDL
// protocol above (GEMM1 waits for the routing before reading the maps, then lets GEMM2 launch;
// GEMM2 reads them before its own wait). Every thread calls it once, first.
template <bool kGemm1>
__device__ __forceinline__ int moe_persistent_items(const MoeGemmParams& p, int m_blocks) {
  if constexpr (kGemm1) pdl_wait();
  const int num_tiles = kGemm1 ? *p.num_tiles : __ldcg(p.num_tiles);
  if constexpr (kGemm1) pdl_launch_dependents();
  return num_tiles * m_blocks;
}

// The expert of token tile `tile` below *num_tiles (after moe_persistent_items).
template <bool kGemm1>
__device__ __forceinline__ int moe_persistent_expert(const MoeGemmParams& p, int tile) {
  return kGemm1 ? p.tile_expert[tile] : __ldcg(p.tile_expert + tile);
}

}  // namespace serval::kernels::cuda
