// Grouped expert GEMMs of both MoE backends (bf16 activations, bf16, NVFP4 or FP8 weights, fp32
// accumulate, bf16 out), swap-AB: weight rows are the MMA M side (tiles of 128 rows), the
// permuted token rows the N side.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// Tile shape family. kLatency: 4 warps, 128 weight rows × `tile` tokens (tile ∈ {8,16,32,64}),
// 4-stage cp.async pipeline (NVFP4, FP8: 6); at tile 8 the weight-row tile shrinks to 64 (2 warps)
// or 32 rows (NVFP4: 1 warp; bf16: 2 warps, each over half of K) with deeper pipelines when the
// worst-case grid would put fewer than 2 CTAs on each SM (moe_gemm_block_rows); the NVFP4
// 128-row tile-8 GEMMs of small grids use two K groups of 4 warps, 3 stages each
// (moe_gemm_k_groups). kThroughput: 8 warps, 128 × 128 (tile must be 128), 3 stages. All kernels
// are launched with programmatic dependent launch (misc/pdl.cuh); GEMM2 reads the routing maps and
// streams its first weight stages before waiting for GEMM1, which is valid only when GEMM2
// directly follows GEMM1 on the stream and GEMM1 directly follows the routing kernel.
enum class MoeGemmConfig : uint8_t { kLatency, kThroughput };

// Expert weight storage. kNvfp4: E2M1 codes and e4m3 block scales (16 along K) in the
// fragment-ordered layout of moe_nvfp4_repack.h, one fp32 global scale per local expert;
// dequantized in registers to bf16 (exact: w·2⁻⁶² = e2m1·e4m3·2⁻⁶²), the global scale (·2⁶²) is
// applied to the fp32 accumulators in the epilogue. kFp8: e4m3 codes in the tiled layout of
// kernels/moe_fp8_layout.h (moe_fp8_repack.h), dequantized in registers to bf16 by bit operations
// times a multiplier: a block-scale multiplier per 16 rows × 16 columns (fp8_multipliers, block
// FP8; the scale rounded to bf16, ~2^-9 relative) or 2^120 exactly with one f32 scale per weight
// row on the accumulators (row_scales: per-channel and per-tensor FP8). The e4m3fn NaN codes
// (0x7F, 0xFF) decode to ±480 (the bit operations know no NaN); saturating quantizers write none.
enum class MoeWeightFormat : uint8_t { kBf16, kNvfp4, kFp8 };

// Works on the maps of moe_routing: CTA (x, y) computes weight rows block x for token tile y of
// expert tile_expert[y]; CTAs with y ≥ *num_tiles exit at once (worst-case grid, no host sync).
//   GEMM1 (gemm1 = true):  act[r, c] = silu(x[tok(r)]·gate[e, c]) · (x[tok(r)]·up[e, c]),
//     c ∈ [0, inter), gathering x rows through permuted_to_token (−1 → zero row).
//   GEMM2 (gemm1 = false): y[r, h] = act[r]·down[e, h], h ∈ [0, hidden).
// bf16 weights are in checkpoint layout, no repacking: gate_up [num_local, 2·inter, hidden] (rows
// [0, inter) gate, [inter, 2·inter) up), down [num_local, hidden, inter]; NVFP4 and FP8 weights
// have the same rows, repacked per expert (moe_nvfp4_repack.h, moe_fp8_repack.h). A CTA of GEMM1
// loads 64 gate rows and the 64 matching up rows so SwiGLU is fused in registers. Requirements: k %
// 64 == 0; GEMM1 inter % 64 == 0; GEMM2 hidden % 128 == 0.
struct MoeGemmParams {
  bool gemm1;
  MoeGemmConfig config;
  const bf16* input;    // GEMM1: x [num_tokens, hidden]; GEMM2: act [rows, inter]
  const void* weights;  // GEMM1: gate_up; GEMM2: down (local experts only): bf16, NVFP4 or FP8
  MoeWeightFormat format = MoeWeightFormat::kBf16;
  const uint8_t* weight_scales = nullptr;  // NVFP4: repacked e4m3 block scales
  const float* global_scales = nullptr;    // NVFP4: [num_local] per-expert multipliers
  // FP8, one of: bf16 bits [moe_fp8_multiplier_count(num_local, rows, k)] of block-scale
  // multipliers (kernels/moe_fp8_layout.h), or f32 [num_local, rows] scales of the weight rows
  // (rows: GEMM1 2·inter, GEMM2 hidden). Both null: the codes are the weights.
  const uint16_t* fp8_multipliers = nullptr;
  const float* row_scales = nullptr;
  bf16* output;  // GEMM1: act [rows, inter]; GEMM2: y [rows, hidden]
  // [rows]: the token of each permuted row (−1: padding). GEMM1 gathers x rows through it; GEMM2
  // may (null: not) take from it only which rows of a tile hold tokens.
  const int32_t* permuted_to_token;
  const int32_t* tile_expert;  // [max_tiles]
  const int32_t* num_tiles;    // [1]
  int max_tiles;               // grid y (worst case)
  int tile;                    // token rows per tile
  int n_out;                   // GEMM1: inter; GEMM2: hidden
  int k;                       // GEMM1: hidden; GEMM2: inter
};

void moe_grouped_gemm(const MoeGemmParams& p, cudaStream_t stream);

// K groups (1 or 2) of the 128-row NVFP4 tile-8 latency GEMMs for `p`: 2 while the worst-case grid
// has at most 12 CTAs per SM (decode up to ~10 tokens of a 128-expert top-8 model: each warp then
// streams half of K, and the per-warp chain of K tiles, not DRAM, bounds these kernels); 1
// otherwise and for every other configuration. SERVAL_MOE_TILE8_KSPLIT=1 / 2 forces it (A/B).
// Host-only, deterministic per shape.
int moe_gemm_k_groups(const MoeGemmParams& p);

// Weight rows per CTA (128, 64 or 32) moe_grouped_gemm uses for `p`: the largest whose
// worst-case grid (row blocks · max_tiles) has ≥ 2 CTAs per SM of the current device, else 32;
// always 128 except for the latency config at tile 8. Host-only, deterministic per shape.
int moe_gemm_block_rows(const MoeGemmParams& p);

// The residual add + RMSNorm that follows an MoE block, fused into its finalize (set: residual
// non-null): residual ← bf16(residual + the block's output), out ← rms_norm(residual) · weight,
// bit for bit kernels::cuda::rms_norm with a residual (one CTA per token in rms_norm's shape,
// which needs hidden ≤ kMoeFinalizeNormMaxHidden). It saves the norm's launch and its round trip
// through the block's output (a decode step's MoE layers end this way).
inline constexpr int kMoeFinalizeNormMaxHidden = 8192;
struct MoeNextNorm {
  bf16* residual = nullptr;      // [num_tokens, hidden], updated in place
  const bf16* weight = nullptr;  // [hidden]
  bf16* out = nullptr;           // [num_tokens, hidden]; may not alias y or residual
  float eps = 0.0f;
};

// out[t] = Σ_j topk_weights[t, j] · y[expanded_to_permuted[t·k + j]] (fp32, j ascending; rows
// −1 skipped) → bf16. hidden % 8 == 0. With `next` set, the next add + norm instead (out unused).
struct MoeFinalizeParams {
  const bf16* y;                        // [rows, hidden]
  const int32_t* expanded_to_permuted;  // [num_tokens · top_k]
  const float* topk_weights;            // [num_tokens, top_k]
  bf16* out;                            // [num_tokens, hidden]; unused with next
  int num_tokens, top_k, hidden;
  MoeNextNorm next = {};
};

// Throws InvalidArgument when hidden % 8 != 0, or with `next` set when hidden exceeds
// kMoeFinalizeNormMaxHidden or a norm pointer is null or not 16-byte aligned.
void moe_finalize(const MoeFinalizeParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
