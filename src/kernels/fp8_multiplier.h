// The bf16 multiplier form of an FP8 block scale used by the CUDA FP8 GEMMs (quant_gemm.h,
// moe_gemm.h): decode_step<false> (kernels/cuda/gemm/quant_fragment.cuh) turns an e4m3 byte into
// bf16 e4m3·2^-120 by bit operations, and the multiplier s·2^120 restores the scale. Plain C++.
#pragma once
#include <cmath>
#include <cstddef>
#include <string>

#include "base/dtype.h"
#include "base/error.h"

namespace serval::kernels {

// bf16(s · 2^120), rounded to nearest: the product then matches the fp32 reference to ~2^-9
// relative, not exactly. `index` names the scale in the message. InvalidArgument for a scale
// that is negative or not finite, or whose multiplier rounds past bf16's largest value (s ≥ 255.5:
// the multiplier would be infinite and turn zero codes into NaN).
inline bf16 fp8_block_multiplier(float s, size_t index) {
  const bf16 m = float_to_bf16(std::ldexp(s, 120));
  if (!(s >= 0.0f) || !std::isfinite(bf16_to_float(m)))
    throw InvalidArgument("FP8 block scale " + std::to_string(index) + " = " + std::to_string(s) +
                          " is outside [0, 255.5) (the CUDA GEMMs fold 2^120 into bf16 scales)");
  return m;
}

}  // namespace serval::kernels
