// The start of every grouped-GEMM CTA (moe_gemm.cu, moe_gemm_wgmma.cu): which expert its token
// tile belongs to, under the PDL protocol of the two GEMMs.
#pragma once
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/moe/moe_gemm.h"

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
