// W4A4 emulation inside the MoE expert GEMMs (--nvfp4-activations with NVFP4 experts): the
// permuted token rows of each expert NVFP4-quantized and dequantized with that expert's own
// activation global scale, before GEMM1 (the gathered x rows) and before GEMM2 (SwiGLU's output).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// On the maps of moe_routing (kernels/cuda/moe/moe_routing.h): for every permuted row r below
// *num_tiles · tile that holds a token (permuted_to_token[r] ≥ 0), with e = tile_expert[r / tile]
// and g = global_scales[e], dst[r, i] = bf16_rn(e2m1(q_i) · e4m3(sf) / g) for the NVFP4
// quantization (q, sf) of the source row with global scale g: bit for bit nvfp4_quant (linear
// layout) then nvfp4_dequant on that row, i.e. kernels::cpu::nvfp4_fake_quant_rows rounded to
// bf16. The source row is x[permuted_to_token[r]] when gathering (GEMM1's input), else src[r]
// (GEMM2's input, dst == src allowed: in place). Gathering also writes rows_out[r] = r for token
// rows and −1 for padding rows, the map GEMM1 then reads dst through (its permuted_to_token).
// Rows without a token are not written. One thread per 16-element block; programmatic dependent
// launch (waits before reading anything); no host synchronization (CUDA-graph safe).
struct Nvfp4ExpertRowsParams {
  const bf16* src;  // gather: [tokens, n]; else [max_rows, n]
  bool gather;
  bf16* dst;                         // [max_rows, n]
  int32_t* rows_out;                 // gather: [max_rows]; else unused
  const int32_t* permuted_to_token;  // [max_rows], −1 for padding rows
  const int32_t* tile_expert;        // [max_tiles]: local expert of each token tile
  const int32_t* num_tiles;          // [1]
  const float* global_scales;        // [num_local] g = 1 / input_scale, finite and > 0
  int tile, max_rows, n;             // n % 16 == 0; src, dst 16-byte aligned rows
};

void nvfp4_fake_quant_expert_rows(const Nvfp4ExpertRowsParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
