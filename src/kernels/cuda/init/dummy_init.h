// Dummy weights (--load-format dummy) generated in device memory: the device twins of
// kernels/cpu/dummy_init.h, the same values from the same counter hash (kernels/dummy_random.h).
// Load-time kernels: launched with programmatic dependent launch like the others, they wait for
// the previous kernel before writing (the output may be memory that kernel just freed).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// out[r·cols + c] for r < rows, c < cols: v = center + (2u − 1)·half_width (fp32, multiply then
// add, each rounded: no fused multiply-add), u = dummy_uniform(key, offset + r·row_stride + c),
// rounded to `source` (kF32 or kBF16: once to bf16; kF16: to f16, then to bf16), stored bf16.
// Bit-identical to kernels::cpu::dummy_dense in `source` followed by a bf16 conversion.
struct DummyDenseParams {
  bf16* out;  // [rows, cols], device
  int64_t rows, cols;
  uint64_t key;
  int64_t offset, row_stride;
  float center, half_width;
  DType source;
};
void dummy_dense(const DummyDenseParams& p, cudaStream_t stream);

// n random bytes, then out &= mask when a mask is given (zeroes the padding of a packed layout).
//   fp8 false: byte j = byte j % 8 of the little-endian word splitmix64(key + j / 8)
//              (kernels::cpu::dummy_bits: random NVFP4 codes).
//   fp8 true:  byte j = e4m3((2u − 1)·half_width), u = dummy_uniform(key, j) (round to nearest
//              even, saturating; kernels::cpu::dummy_fp8).
struct DummyBytesParams {
  uint8_t* out;         // [n], device, 8-byte aligned
  const uint8_t* mask;  // [n], device, 8-byte aligned, or null
  int64_t n;
  uint64_t key;
  bool fp8;
  float half_width;
};
void dummy_bytes(const DummyBytesParams& p, cudaStream_t stream);

// out[r, c] (out_rows × out_cols) = dummy_code(dummy_uniform(key, r·cols + c), lo, hi) for
// r < rows, c < cols, and 0 in the padding (r ≥ rows or c ≥ cols): random NVFP4 block-scale codes
// of the checkpoint layout [rows, cols] embedded in a zero-padded one, row-major or, with
// gemm_tiles, in quant_gemm's tiled scale layout (out_rows % 32 == 0, out_cols % 4 == 0).
struct DummyCodesParams {
  uint8_t* out;  // out_rows · out_cols bytes, device
  int64_t rows, cols, out_rows, out_cols;
  uint64_t key;
  uint8_t lo, hi;
  bool gemm_tiles = false;
};
void dummy_codes(const DummyCodesParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
