// MoE routing on the device: per-token top-k, then the per-expert tile maps both expert
// backends consume. No host synchronisation; graph-capturable (all sizes are launch-time).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/params.h"

namespace serval::kernels::cuda {

// Largest expert count the warp top-k handles (8 scores per lane).
inline constexpr int kMoeMaxExperts = 256;
// Largest top_k.
inline constexpr int kMoeMaxTopK = 32;
// Most chunks (CTAs) of the multi-CTA map builder; MoeRoutingParams::chunk_counts holds
// kMoeMaxMapChunks · num_local ints.
inline constexpr int kMoeMaxMapChunks = 64;

// Worst-case number of token tiles: Σ_e ceil(count_e / tile) ≤ pairs / tile + min(E_local, pairs).
inline int moe_max_tiles(int num_pairs, int num_local, int tile) {
  int nonempty = num_pairs < num_local ? num_pairs : num_local;
  return num_pairs / tile + nonempty;
}

// Maps built by the routing kernel. "Pair" p = t·top_k + j (token t's j-th choice). Each local
// expert owns a segment of the permuted rows padded to a multiple of `tile`; tile c of the
// grouped GEMMs covers permuted rows [c·tile, (c+1)·tile) of expert tile_expert[c].
struct MoeRoutingParams {
  const float* logits;           // [num_tokens, num_experts] fp32
  const float* correction_bias;  // [num_experts] or null (grouped method only)
  int num_tokens, num_experts, top_k;
  RoutingMethod method;
  bool renormalize;
  int num_groups = 1, topk_groups = 1;
  float routed_scaling_factor = 1.0f;
  int local_offset = 0, num_local = 0;  // this rank's experts [local_offset, +num_local)
  int tile = 8;                         // token tile of the grouped GEMMs (rows per tile)

  // Outputs.
  int32_t* topk_ids;              // [num_tokens, top_k] global expert ids, descending score
  float* topk_weights;            // [num_tokens, top_k]
  int32_t* expanded_to_permuted;  // [num_tokens · top_k]; −1 for experts outside the slice
  int32_t* permuted_to_token;     // [moe_max_tiles · tile]; −1 for padding rows (valid tiles)
  int32_t* tile_expert;           // [moe_max_tiles]: local expert of each valid tile
  int32_t* num_tiles;             // [1]: tiles in use; GEMM CTAs at or past it exit

  // Scratch of the multi-CTA map builder: [kMoeMaxMapChunks, num_local] per-chunk expert counts.
  // Null: the single-CTA map kernel at every size.
  int32_t* chunk_counts = nullptr;
};

// Which kernels build the maps above the few-token sizes: kAuto picks the multi-CTA builder
// (kChunked) from kMoeChunkedMapsMinTokens tokens when chunk_counts is given, else one
// 1024-thread CTA (kSingleCta). Tests and benchmarks force either. Top-k + maps on the H200
// (Qwen3: 128 experts, top-8; MoeSmallKernelsBench.DISABLED_RoutingMaps), one CTA / chunked:
// 256 tokens 7.5 / 8.4 µs, 512 10.3 / 7.8, 1024 15.7 / 7.2, 8192 108.6 / 18.5.
enum class MoeMapsKernel { kAuto, kSingleCta, kChunked };
inline constexpr int kMoeChunkedMapsMinTokens = 512;

// Up to 8 tokens one 256-thread CTA (maps built in shared memory, ranks in pair order), above that
// a top-k kernel (a warp per token) and the map kernels `maps` picks. Throws InvalidArgument for
// kChunked without chunk_counts.
void moe_routing(const MoeRoutingParams& p, cudaStream_t stream,
                 MoeMapsKernel maps = MoeMapsKernel::kAuto);

// Throws InvalidArgument unless moe_routing takes p's sizes and routing method (pointers are
// not checked).
void moe_routing_check(const MoeRoutingParams& p);

// The fused 1024-thread single-CTA kernel alone (top-k and maps), for any num_tokens ≤ 128 (what
// moe_routing ran for 1–128 tokens before the few-token kernel and the multi-CTA top-k took them):
// kept for the side-by-side benchmark and as a second device implementation in the tests. Same
// output contract as moe_routing.
void moe_routing_single_cta(const MoeRoutingParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
