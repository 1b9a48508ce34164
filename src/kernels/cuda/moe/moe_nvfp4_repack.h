// Load-time repacking of NVFP4 expert stacks into the fragment-ordered layout the grouped MoE
// GEMMs (moe_gemm.h) read, with zero padding of rows and K.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace serval::kernels::cuda {

// The repacked layout ("MMA-fragment order"), per expert e, for a weight of `rows` × `k`
// (rows % 16 == 0, k % 64 == 0 after padding). Tile (mt, kb) covers rows [16·mt, 16·mt + 16)
// and columns [64·kb, 64·kb + 64); tiles are stored mt-major: tile index mt·(k/64) + kb.
//   Codes: 512 bytes per tile at e·rows·k/2 + tile·512. Lane l (g = l/4, t4 = l%4) of a warp
//     owns bytes [16·l, 16·l + 16): four little-endian u32 words, word kk (k16 step kk of the
//     tile, columns c0 = 64·kb + 16·kk) holding the 8 E2M1 codes of MMA registers a0..a3, each
//     register's pair (low half: column c, high half: column c + 1) placed as
//     kernels/nvfp4_word.h's nvfp4_word_bits(code, j, half) says:
//       a0 = W[g][c0 + 2·t4 + {0, 1}]          a1 = W[g + 8][c0 + 2·t4 + {0, 1}]
//       a2 = W[g][c0 + 2·t4 + 8 + {0, 1}]      a3 = W[g + 8][c0 + 2·t4 + 8 + {0, 1}]
//     (rows relative to 16·mt), so one 16-byte load gives a lane its A fragments of 4 MMAs.
//   Block scales (e4m3, unchanged values): 64 bytes per tile at e·rows·k/16 + tile·64; byte
//     8·g + 2·kk + h is the scale of row 16·mt + g + 8·h, K block 4·kb + kk.
// Padding: rows and columns beyond the source are code 0 with scale 0x00 (exact zeros).
struct MoeNvfp4RepackParams {
  const uint8_t* src_data;    // [experts, src_rows, src_k/2], element 2i in the low nibble
  const uint8_t* src_scales;  // [experts, src_rows, src_k/16] e4m3
  uint8_t* dst_data;          // [experts · rows · k/2] repacked (size: moe_nvfp4_data_bytes)
  uint8_t* dst_scales;        // [experts · rows · k/16] repacked
  int experts;
  int src_rows, src_k;  // src_k % 16 == 0
  int rows, k;          // padded: rows % 16 == 0, k % 64 == 0, rows ≥ src_rows, k ≥ src_k
  // Gated (GEMM1 gate_up): source rows [0, src_rows/2) gate and [src_rows/2, src_rows) up go to
  // rows [0, rows/2) and [rows/2, rows), each half zero-padded at its end. Otherwise row r → r.
  bool gated;
};

inline size_t moe_nvfp4_data_bytes(int experts, int rows, int k) {
  return size_t(experts) * rows * (k / 2);
}
inline size_t moe_nvfp4_scale_bytes(int experts, int rows, int k) {
  return size_t(experts) * rows * (k / 16);
}

// Throws InvalidArgument for shapes outside the contract above.
void moe_nvfp4_repack(const MoeNvfp4RepackParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
