// The scales of an FP8 MoE expert stack in the form the CUDA grouped GEMMs read
// (kernels/moe_fp8_layout.h), built on the host at load time. Plain C++ (CPU unit tests).
#pragma once
#include <span>
#include <vector>

#include "base/dtype.h"

namespace serval::backend::moe {

// A checkpoint stack of `experts` weights [src_rows, src_k] padded to [rows, k] for the GEMMs
// (rows % 16 == 0, k % 64 == 0; gated: gate and up halves padded separately, rows % 32 == 0).
struct MoeFp8Geometry {
  int experts = 0, src_rows = 0, src_k = 0, rows = 0, k = 0;
  bool gated = false;
};

// Block FP8 (block_n × block_k tiles): `block_scales` f32 [experts, ceil(src_rows/block_n),
// ceil(src_k/block_k)] → the per-tile multipliers of kernels/moe_fp8_layout.h
// (moe_fp8_multiplier_count elements; 0 for padding). InvalidArgument when block_n or block_k
// is not a multiple of 16, when a 16-row group of the padded stack spans two block rows (a gated
// stack's gate half must then be a multiple of 16 rows), or for a scale outside [0, 255.5)
// (kernels/fp8_multiplier.h).
std::vector<bf16> moe_fp8_block_multipliers(const float* block_scales, int block_n, int block_k,
                                            const MoeFp8Geometry& g);

// Per-channel (`channel_scales` f32 [experts, src_rows]) or per-tensor (`channel_scales` null:
// expert_scales [experts]) FP8 → one f32 scale per padded row, [experts, rows] (0 for padding),
// applied to the GEMMs' fp32 accumulators. InvalidArgument when expert_scales has the wrong size
// or a scale is not finite.
std::vector<float> moe_fp8_row_scales(const float* channel_scales,
                                      std::span<const float> expert_scales,
                                      const MoeFp8Geometry& g);

}  // namespace serval::backend::moe
