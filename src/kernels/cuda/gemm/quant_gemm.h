// Weight-only quantized GEMMs (W4A16 NVFP4, W8A16 FP8 e4m3): y[m, n] = x[m, k] · dequant(W)[n, k]ᵀ
// (+ bias), bf16 activations, fp32 accumulation, bf16 or f32 output. The weights live on the
// device in a "fragment" layout (below) made once at load time by the quant_gemm_pack_* helpers,
// so each lane's 16-byte load holds exactly the elements of its mma.sync m16n8k16 A fragments and
// is dequantized to bf16 in registers (no shared memory, no conversion instructions).
//
// Device layout. n_pad = round_up(n, 32), k_pad = round_up(k, 64); padded rows/columns hold code
// 0 (and scale 0), so they contribute nothing. A "row tile" is 32 rows (two 16-row groups h), a
// "k block" 64 columns. For row tile rt, k block kb, group h, lane l (g = l / 4, t = l % 4) the
// lane's bytes start at (((rt · k_pad/64 + kb) · 2 + h) · 32 + l) · B, B = 16 (NVFP4) or 32 (FP8).
// They hold, for each k16 step s in 0..3, the four bf16x2 A-fragment registers a0..a3:
//   a0 = row g,   columns c, c+1;   a1 = row g+8, columns c, c+1;
//   a2 = row g,   columns c+2, c+3; a3 = row g+8, columns c+2, c+3;   c = 16t + 4s
// (rows relative to the group's first row rt·32 + 16h, columns to kb·64). The MMA's k index
// 2t (+1) of step s is physical column c (+1) and 2t+8 (+1) is c+2 (+1): the 64 columns are
// permuted inside the block so that lane t's columns are 16t .. 16t+15 in every step. Its B
// fragments are then the 8 consecutive activation words 8t .. 8t+7 (two 16-byte loads), and its
// columns lie in one NVFP4 scale group (4kb + t) / FP8 block, so it needs one multiplier pair
// per k block instead of one per step.
//   NVFP4: 32-bit word s holds register a_i's two codes (low half = even column, high half) at
//          the bit positions of kernels/nvfp4_word.h, chosen so that decoding takes few ops.
//   FP8:   32-bit word 2s + i/2; even i takes bytes 1 (low) and 3 (high), odd i bytes 0 and 2.
// Scales: NVFP4 e4m3, n_pad · k_pad/16 bytes in 128-byte tiles, one per (row tile rt, k block
// kb) at (rt · k_pad/64 + kb) · 128; inside, 32-bit word 4 · (row % 8) + (row % 32) / 8 holds the
// row's four 16-column groups (byte = group % 4), so lane g of a warp reads the scales of rows g,
// g+8, g+16 and g+24 with one 16-byte load from one 128-byte line (zero padded; see
// quant_gemm_nvfp4_scale_offset). FP8 per-channel f32 [n]; FP8 block: bf16 multipliers s·2^120
// [ceil(n/block_n), ceil(k/block_k)] (the fp32 block scale rounded to bf16: results match the fp32
// reference to ~2^-9 relative, not exactly); FP8 per-tensor: none (global_scale).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "kernels/nvfp4_layout.h"  // SERVAL_HOST_DEVICE
#include "kernels/params.h"

namespace serval::kernels::cuda {

// The direct kernel is used up to this many rows of x; beyond it the caller dequantizes the
// weight to bf16 (quant_dequant_bf16) and runs a dense GEMM (first version; not yet measured).
constexpr int kQuantGemmMaxM = 64;

struct QuantGemmWeight {
  WeightFormat format;
  int n, k;              // logical shape; k % 8 == 0 (NVFP4: k % 16 == 0)
  const uint8_t* data;   // fragment layout, quant_gemm_data_bytes(format, n, k) bytes
  const void* scales;    // see the layout comment; null for FP8 per-tensor
  float global_scale;    // NVFP4 weight_scale_2; FP8 per-tensor weight_scale; else 1
  int block_n, block_k;  // FP8 block only; block_k % 16 == 0
};

struct QuantGemmParams {
  const bf16* x;  // [m, k], 4-byte aligned
  QuantGemmWeight w;
  const bf16* bias;  // [n] or null
  void* y;           // [m, n], bf16 or f32 (y_f32); [m, n/2] bf16 with swiglu
  bool y_f32;
  int m;
  void* workspace;  // quant_gemm_workspace_bytes(m, n, k) bytes (may be 0 → null)
  size_t workspace_bytes;
  // SwiGLU epilogue (decode GEMV only, quant_gemv_supported): w is a gate/up weight whose rows
  // are tiled (quant_gemm_gate_up_source_row), and y[t, j] = silu(gate_j) · up_j with both
  // projections finished in fp32 (alpha, row scale) and rounded to bf16 once. No bias.
  bool swiglu;
};

// Row order of a gate/up weight [2·inter, k] (rows [0, inter) gate, [inter, 2·inter) up;
// inter % 16 == 0) for the SwiGLU epilogue: device row r holds checkpoint row
// quant_gemm_gate_up_source_row(r, inter), i.e. row tile t (32 rows) is gate rows [16t, 16t + 16)
// then up rows [16t, 16t + 16), so the lane holding gate row j also holds up row j. Any path that
// writes the tiled rows' outputs as they are (quant_gemm, the dequant + dense GEMM) produces
// columns in this order; kernels::cuda::silu_mul with tile 16 reads it.
SERVAL_HOST_DEVICE constexpr int quant_gemm_gate_up_source_row(int r, int inter) {
  return r % 32 < 16 ? 16 * (r / 32) + r % 32 : inter + 16 * (r / 32) + r % 32 - 16;
}

// Device-layout sizes.
int quant_gemm_n_pad(int n);
int quant_gemm_k_pad(int k);
size_t quant_gemm_data_bytes(WeightFormat format, int n, int k);

// Byte offset of the NVFP4 scale of row `row`, 16-column group `group` in the tiled scale layout
// above; k_blocks = k_pad / 64.
SERVAL_HOST_DEVICE constexpr int64_t quant_gemm_nvfp4_scale_offset(int64_t row, int64_t group,
                                                                   int64_t k_blocks) {
  return ((row / 32) * k_blocks + group / 4) * 128 + ((row % 8) * 4 + (row % 32) / 8) * 4 +
         group % 4;
}

// Host repacking (load time). `src`: checkpoint layout, NVFP4 u8 [n, k/2] or FP8 e4m3 [n, k].
std::vector<uint8_t> quant_gemm_pack_data(WeightFormat format, const uint8_t* src, int n, int k);
// NVFP4 block scales e4m3 [n, k/16] → the tiled scale layout (n_pad · k_pad/16 bytes), zero padded.
std::vector<uint8_t> quant_gemm_pack_nvfp4_scales(const uint8_t* src, int n, int k);
// FP8 block scales f32 [rows, cols] → bf16 s·2^120 (kernels/fp8_multiplier.h, which throws
// InvalidArgument for a scale outside [0, 255.5)).
std::vector<bf16> quant_gemm_pack_block_scales(const float* src, size_t count);

// Fp32 partial-sum workspace for split-K (0 when one split suffices); an upper bound for every m
// (the decode GEMV at m ≤ 16 uses none).
size_t quant_gemm_workspace_bytes(int m, int n, int k);

// y = x · dequant(W)ᵀ (+ bias) for any m ≥ 0 (efficient for m ≤ kQuantGemmMaxM: tokens are the
// MMA N side in one tile of 8/16/32/64, so the weight streams once; larger m repeat per 64-token
// tile). 1 ≤ m ≤ 16 runs the decode GEMV of quant_gemv.h where it supports the weight (no caller
// workspace, but one such call at a time per device; the mma kernel stays reachable as
// quant_gemm_mma). Launched with programmatic dependent launch. Deterministic.
void quant_gemm(const QuantGemmParams& p, cudaStream_t stream);

// out[n, k] (bf16, row-major, 16-byte aligned) = dequant(W), each element rounded once from fp32
// (16-byte coalesced stores through a per-warp shared-memory tile).
void quant_dequant_bf16(const QuantGemmWeight& w, bf16* out, cudaStream_t stream);

}  // namespace serval::kernels::cuda
