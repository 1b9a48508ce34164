// CPU reference of NVFP4 activation quantization (vLLM's `scaled_fp4_quant`, SPEC §2.2) and the
// scalar E2M1 codec. The oracle of the CUDA kernel (kernels/cuda/quant/nvfp4_quant.h): both
// follow the same float operations, so their outputs agree bit for bit.
#pragma once
#include <cstdint>

#include "base/dtype.h"
#include "kernels/nvfp4_layout.h"

namespace serval::kernels::cpu {

// E2M1 code of v: |v| rounded to nearest even on the grid 0, .5, 1, 1.5, 2, 3, 4, 6
// (≤.25→0, (.25,.75)→.5, [.75,1.25]→1, (1.25,1.75)→1.5, [1.75,2.5]→2, (2.5,3.5)→3, [3.5,5]→4,
// >5→6), saturating at 6 (inf too); NaN → magnitude 6 (code 7). Sign bit 3 = signbit(v), so
// -0.0 and small negatives that round to 0 give 0x8.
uint8_t e2m1_encode_rne_satfinite(float v);
// Value of the low nibble of `code` (bit 3 = sign).
float e2m1_decode(uint8_t code);

// Quantizes x [m, n] to packed E2M1 + E4M3 scale factors. Per block of 16 consecutive elements
// of a row, in this exact float order (the CUDA kernel repeats it):
//   amax  = max |x_i| over the block, NaNs ignored (fmax), starting from 0
//   sf    = float_to_e4m3((g · amax) / 6)            (RNE, saturate to 448)
//   scale = sf == 0 ? 0 : g / e4m3_to_float(sf)     (IEEE division)
//   q_i   = sf == 0 ? 0 : sign(x_i) · e2m1_rne_satfinite(x_i · scale)
// where sign(x_i) is the sign bit of the stored input (bit 3 of the code). So inf makes its block
// saturate (sf = 448, inf → ±6), NaN elements encode as ±6 (code 7, sign from the input bits)
// unless the block's other elements give sf == 0, in which case the whole block is 0.
struct Nvfp4QuantParams {
  const void* x;  // [m, n] row-major, x_dtype (kBF16 or kF16)
  DType x_dtype;
  float global_scale;  // g = 448·6/amax(tensor) = 1/input_scale; finite and > 0
  uint8_t* q;          // [m, n/2]: element 2i in the low nibble of byte i
  uint8_t* sf;         // nvfp4_sf_bytes(m, n, sf_layout) bytes; padding bytes are written 0
  Nvfp4SfLayout sf_layout;
  int m, n;  // n % 16 == 0
};

void nvfp4_quant(const Nvfp4QuantParams& p);

// W4A4 emulation: rows x [m, n] (f32) → out [m, n] (f32, may alias x), each row rounded to bf16
// (the activation dtype on the GPU), quantized by nvfp4_quant (global scale g) and dequantized:
// out_i = e2m1(q_i) · e4m3(sf) / g. A GEMM of these values with the dequantized weights equals
// the W4A4 GEMM with alpha = input_scale · weight_scale_2. n % 16 == 0, g finite and > 0.
void nvfp4_fake_quant_rows(const float* x, int m, int n, float global_scale, float* out);

}  // namespace serval::kernels::cpu
