// NVFP4 activation quantization on the GPU (vLLM's `scaled_fp4_quant`, SPEC §2.2): bf16/f16
// [m, n] -> packed E2M1 [m, n/2] + E4M3 block scale factors, swizzled 128x4 or linear.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/nvfp4_layout.h"

namespace serval::kernels::cuda {

// Bit-identical to kernels::cpu::nvfp4_quant (same float operations in the same order; see the
// CPU header for the per-block formula and the inf/NaN rules). In the swizzled layout the kernel
// itself writes 0 to every padding SF byte (rows >= m, SF columns >= n/16) in the same launch, so
// `sf` may be uninitialized; when m % 128 == 0 and (n/16) % 4 == 0 it runs a variant with no
// padding work. The grid is persistent (at most 4 CTAs per SM, each looping over 128x64 tiles
// with the next tile's loads in flight). No allocation, no host synchronization (CUDA-graph safe).
struct Nvfp4QuantParams {
  const void* x;  // [m, n] row-major, contiguous, x_dtype (kBF16 or kF16); 16-B aligned
  DType x_dtype;
  const float* global_scale;  // device pointer to one fp32 g = 448·6/amax = 1/input_scale (> 0)
  uint8_t* q;                 // [m, n/2] packed E2M1, element 2i in the low nibble; 4-B aligned
  uint8_t* sf;                // nvfp4_sf_bytes(m, n, sf_layout) bytes; 16-B aligned when swizzled
  Nvfp4SfLayout sf_layout;
  int m, n;  // m >= 0, n > 0, n % 16 == 0
};

void nvfp4_quant(const Nvfp4QuantParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
