// Dequantization of quant_gemm's fragment layout (quant_gemm.h) into bf16 MMA A fragments,
// shared by the mma kernel (quant_gemm.cu) and the decode GEMV (quant_gemv.cu). Included only by
// .cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/nvfp4_word.h"

namespace serval::kernels::cuda {

constexpr uint32_t kFp8Mult = 0x7B807B80u;  // bf16x2 {2^120, 2^120}

// bf16x2 {v, v} with v = e4m3(byte) · 2^119 (exact). Normal e4m3 (exponent e ≥ 1): bf16 exponent
// e + 239, mantissa mmm; subnormal (m/8 · 2^-6): m · 2^110; zero → 0.
__device__ __forceinline__ uint32_t nvfp4_mult(uint32_t byte) {
  const uint32_t mag = byte & 0x7Fu;
  uint32_t h;
  if (mag & 0x78u) {
    h = (mag << 4) + (239u << 7);
  } else {
    h = __float_as_uint(float(mag) * 0x1p110f) >> 16;  // ≤ 3 significant bits: exact
  }
  return h | (h << 16);
}

// The four A registers of k16 step s for one 16-row group, dequantized and multiplied:
// NVFP4 values become e2m1·sf·2^-7, FP8 values e4m3·(block scale or 1).
// `words`: the lane's 4 (NVFP4) or 8 (FP8) words; m_lo / m_hi: multipliers of rows g / g+8.
template <bool kFp4>
__device__ __forceinline__ void decode_step(const uint32_t* words, int s, uint32_t m_lo,
                                            uint32_t m_hi, uint32_t (&a)[4]) {
  if constexpr (kFp4) {
    const uint32_t q = words[s];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // e2m1 (s e1 e0 m) → bf16 sign, exponent low bits e1e0, mantissa msb m: value e2m1·2^-126
      // (the word's bit placement: kernels/nvfp4_word.h).
      a[i] = bf16x2_mul(nvfp4_bf16x2_bits(q, i), (i & 1) ? m_hi : m_lo);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t q = words[2 * s + j];
      const uint32_t q2 = q << 8;
      // e4m3 in the high byte of each half → bf16 sign, exponent low 4 bits, mantissa top 3
      // bits: value e4m3·2^-120 (subnormals included); the multiplier carries the 2^120.
      const uint32_t v0 = (q & 0x80008000u) | ((q & 0x7F007F00u) >> 4);
      const uint32_t v1 = (q2 & 0x80008000u) | ((q2 & 0x7F007F00u) >> 4);
      a[2 * j] = bf16x2_mul(v0, m_lo);
      a[2 * j + 1] = bf16x2_mul(v1, m_hi);
    }
  }
}

}  // namespace serval::kernels::cuda
