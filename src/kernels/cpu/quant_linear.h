// y = x · Wᵀ on the CPU for quantized weights (NVFP4, FP8 per-tensor / per-channel / block):
// each weight row is dequantized into fp32 once (QuantLinearParams gives the exact formula) and
// dotted with every input row, as the dense kernel does with bf16 rows. The oracle of the
// CUDA quantized GEMMs.
#pragma once
#include "kernels/params.h"

namespace serval::kernels::cpu {

void quant_linear(const QuantLinearParams& p);

// Row `row` of the dequantized weight: out[0, p.k) (reads p.format, w, scales, global_scale,
// block_n/block_k, n, k; ignores x, y, bias, m).
void dequant_weight_row(const QuantLinearParams& p, int row, float* out);

}  // namespace serval::kernels::cpu
