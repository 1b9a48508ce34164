// Host side of the CUDA backend's upload_quantized for a single quantized linear: the bytes of
// its device layout (kernels/cuda/gemm/quant_gemm.h), built on the host before one copy each.
// Gate/up weights of SwiGLU MLPs (QuantizedWeight::gate_up) get their rows tiled per 16
// (quant_gemm_gate_up_source_row) so that the decode GEMV can finish silu(gate) · up itself.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "base/dtype.h"
#include "kernels/cuda/gemm/quant_gemm.h"

namespace serval::backend::cuda {

struct PackedLinear {
  std::vector<uint8_t> data;          // fragment layout, quant_gemm_data_bytes(format, n, k)
  std::vector<uint8_t> nvfp4_scales;  // NVFP4: e4m3 [n_pad, k_pad / 16] in 128-byte tiles
  std::vector<bf16> block_scales;     // FP8 block: bf16 multipliers, the host scales' shape
  std::vector<float> channel_scales;  // FP8 per-channel: f32 [n], in device row order
  bool rows_reordered = false;        // rows in the gate/up tiled order
};

// Whether a weight's rows are stored tiled: a gate/up weight of one linear (not an expert stack)
// with whole 32-row tiles, in any format but FP8 block (its scale blocks do not follow a row
// permutation). SERVAL_NO_GATE_UP_TILING=1 turns the tiling off (side-by-side comparisons).
bool tiles_gate_up(const QuantizedWeight& w);

// Throws InvalidArgument unless w is one linear (experts == 0) with n > 0 and k > 0, k % 8 == 0
// (NVFP4: k % 16 == 0): the shapes the fragment layout holds.
void check_quantized_linear_shape(const QuantizedWeight& w);

// `host`: a single linear in checkpoint layout (experts == 0, data and scales host tensors as
// QuantizedWeight describes). Throws InvalidArgument on a shape the layout cannot hold or on
// scales of the wrong dtype.
PackedLinear pack_quantized_linear(const QuantizedWeight& host);

// The kernels' view (kernels/cuda/gemm/quant_gemm.h) of a single linear uploaded in that layout.
kernels::cuda::QuantGemmWeight quant_gemm_weight(const QuantizedWeight& dev);

}  // namespace serval::backend::cuda
