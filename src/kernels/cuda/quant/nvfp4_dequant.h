// The second half of the W4A4 emulation on Hopper (no FP4 matrix unit): NVFP4 activations
// (nvfp4_quant, linear SF layout) back to bf16 for the W4A16 GEMMs.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// out[r, i] = bf16_rn(e2m1(q[r, i]) · e4m3(sf[r, i/16]) / g), the fp32 value computed exactly as
// kernels::cpu::nvfp4_fake_quant_rows does (so the results agree after rounding that to bf16).
struct Nvfp4DequantParams {
  const uint8_t* q;           // [m, n/2], element 2i in the low nibble
  const uint8_t* sf;          // [m, n/16] e4m3 (linear layout)
  const float* global_scale;  // device pointer to g (the one nvfp4_quant used)
  bf16* out;                  // [m, n]
  int m, n;                   // n % 16 == 0
};

void nvfp4_dequant(const Nvfp4DequantParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
