// The device layout of FP8 (e4m3) MoE expert stacks, shared by the CUDA repacking kernel, the
// grouped expert GEMMs (kernels/cuda/moe/moe_gemm.cu) and the host code that builds the scales;
// plain C++ so that the CPU unit tests check it.
//
// Per expert, a weight of `rows` × `k` (both padded: rows % 16 == 0, k % 64 == 0) is stored in
// tiles of 16 rows × 64 columns, tile (mt, kb) at byte (mt · k/64 + kb) · 1024 of the expert's
// rows · k bytes. A tile holds the A fragments of the 4 k16 steps of mma.sync m16n8k16 for the
// 32 lanes of a warp (g = lane / 4, t4 = lane % 4):
//   a0 = W[g][c + 2·t4 + {0, 1}]        a1 = W[g + 8][c + 2·t4 + {0, 1}]
//   a2 = W[g][c + 2·t4 + 8 + {0, 1}]    a3 = W[g + 8][c + 2·t4 + 8 + {0, 1}]
// (rows relative to 16·mt, c = 64·kb + 16·step). Lane l's eight 32-bit words (word 2·step + j
// holds registers a_{2j} and a_{2j+1}: a_{2j} in bytes 1 (low half, even column) and 3 (high
// half), a_{2j+1} in bytes 0 and 2, which kernels/cuda/gemm/quant_fragment.cuh decode_step<false>
// turns into bf16 by bit operations) are split in two 16-byte halves: words 0-3 at
// 16·l, words 4-7 at 512 + 16·l, so that a warp's two 16-byte shared-memory loads are
// conflict free.
//
// Padding: gated stacks (GEMM1's gate_up) keep gate rows in [0, rows/2) and up rows in
// [rows/2, rows), each half zero-padded at its end; rows and columns past the source are code 0.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/nvfp4_layout.h"  // SERVAL_HOST_DEVICE

namespace serval::kernels {

inline constexpr int kMoeFp8TileRows = 16, kMoeFp8TileCols = 64, kMoeFp8TileBytes = 1024;

// Source row of padded row r of a stack with `src_rows` real rows padded to `rows`, or −1 for a
// padding row. Gated: source rows [0, src_rows/2) gate and [src_rows/2, src_rows) up map to
// [0, rows/2) and [rows/2, rows).
SERVAL_HOST_DEVICE constexpr int moe_padded_source_row(int r, int src_rows, int rows, bool gated) {
  if (!gated) return r < src_rows ? r : -1;
  const int half = r / (rows / 2), i = r % (rows / 2), src_half = src_rows / 2;
  return i < src_half ? half * src_half + i : -1;
}

// Whether a stack of src_rows × src_k padded to rows × k (gated: halves padded apart) has the
// layout's shape: rows % 16 == 0, k % 64 == 0, nothing shrinks, gated halves of whole rows.
SERVAL_HOST_DEVICE constexpr bool moe_fp8_padding_ok(int src_rows, int src_k, int rows, int k,
                                                     bool gated) {
  return src_rows > 0 && src_k > 0 && rows >= src_rows && k >= src_k && rows % 16 == 0 &&
         k % 64 == 0 && (!gated || (src_rows % 2 == 0 && rows % 32 == 0));
}

// Byte offset of element (row, col) inside one expert of the layout above (k: padded columns).
SERVAL_HOST_DEVICE constexpr size_t moe_fp8_byte_offset(int row, int col, int k) {
  const int mt = row / 16, rr = row % 16, g = rr % 8, hi = rr / 8;
  const int kb = col / 64, cc = col % 64, step = cc / 16, q = cc % 16;
  const int j = q / 8, t4 = (q % 8) / 2, half = q % 2;
  const int lane = g * 4 + t4, word = 2 * step + j;
  const int byte = hi ? (half ? 2 : 0) : (half ? 3 : 1);
  return (size_t(mt) * (k / 64) + kb) * kMoeFp8TileBytes + size_t(word / 4) * 512 +
         size_t(lane) * 16 + size_t(word % 4) * 4 + size_t(byte);
}

// The element (row, col) stored at byte `offset` of one expert (the inverse of
// moe_fp8_byte_offset).
struct MoeFp8Element {
  int row, col;
};
SERVAL_HOST_DEVICE constexpr MoeFp8Element moe_fp8_element_at(size_t offset, int k) {
  const size_t tile = offset / kMoeFp8TileBytes;
  const int in_tile = int(offset % kMoeFp8TileBytes);
  const int mt = int(tile / size_t(k / 64)), kb = int(tile % size_t(k / 64));
  const int lane = (in_tile % 512) / 16, word = (in_tile / 512) * 4 + (in_tile % 16) / 4;
  const int byte = in_tile % 4;
  const int g = lane / 4, t4 = lane % 4, step = word / 2, j = word % 2;
  const int hi = (byte == 0 || byte == 2) ? 1 : 0, half = byte >= 2 ? 1 : 0;
  return {mt * 16 + g + 8 * hi, kb * 64 + step * 16 + j * 8 + 2 * t4 + half};
}

// Block-scale multipliers of a stack in the layout above: per expert, per tile (mt, kb), four
// bf16 values (one per k16 step) at element ((e · rows/16 + mt) · k/64 + kb) · 4 + step: the
// block scale of the tile's rows and the step's columns times 2^120 (decode_step's convention).
inline constexpr int kMoeFp8MultipliersPerTile = 4;
SERVAL_HOST_DEVICE constexpr size_t moe_fp8_multiplier_count(int experts, int rows, int k) {
  return size_t(experts) * (rows / 16) * (k / 64) * kMoeFp8MultipliersPerTile;
}

}  // namespace serval::kernels
