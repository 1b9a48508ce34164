// Where the eight E2M1 codes of one 32-bit lane word of quant_gemm's NVFP4 fragment layout sit,
// and how the decoder turns register a_i's two codes into bf16x2 bits. Shared by the host packer
// (kernels/cuda/gemm/quant_gemm_pack.cu) and the device decoder (quant_fragment.cuh).
//
// Register a_i holds two codes, "lo" (the even column, bf16x2 low half) and "hi" (odd column,
// high half). The decoder wants, per half, the sign at bit 15 (31) and the 3 magnitude bits
// (e1 e0 m) at bits 8..6 (24..22): then bf16 = e2m1 · 2^-126 and the block scale's multiplier
// (which carries 2^126 through the global scale) finishes the value. So the packer stores each
// code's bits where a left rotation of the word by nvfp4_rot_sign(i) (sign) and nvfp4_rot_mag(i)
// (magnitude) brings them: one rotate + one masking LOP3 when the two rotations agree, two of
// each otherwise. The rotations were chosen by exhaustive search as the cheapest set whose 4 × 2
// codes tile the 32 bits: 11 integer ops per word against 15 for plain nibbles (each followed by
// the bf16x2 scale multiply) — the NVFP4 GEMV is instruction-bound.
#pragma once
#include <array>
#include <cstdint>

#include "kernels/nvfp4_layout.h"  // SERVAL_HOST_DEVICE

namespace serval::kernels {

// Left rotations of register i's sign and magnitude bits (functions: device code cannot read
// namespace-scope arrays).
SERVAL_HOST_DEVICE constexpr int nvfp4_rot_sign(int i) {
  return i == 0 ? 0 : i == 1 ? 12 : i == 2 ? 2 : 1;
}
SERVAL_HOST_DEVICE constexpr int nvfp4_rot_mag(int i) {
  return i == 0 ? 6 : i == 1 ? 12 : i == 2 ? 2 : 15;
}
inline constexpr uint32_t kNvfp4SignBits = 0x80008000u, kNvfp4MagBits = 0x01C001C0u;

SERVAL_HOST_DEVICE constexpr uint32_t rotl32(uint32_t x, int r) {
  return r == 0 ? x : (x << r) | (x >> (32 - r));
}

// The word bits of E2M1 `code` (4 bits: m, e0, e1, sign) as register i's `half` (0 lo, 1 hi).
SERVAL_HOST_DEVICE constexpr uint32_t nvfp4_word_bits(uint32_t code, int i, int half) {
  const int base = half ? 16 : 0;
  uint32_t w = 0;
  for (int b = 0; b < 3; ++b)
    if ((code >> b) & 1u) w |= 1u << ((base + 6 + b - nvfp4_rot_mag(i) + 32) % 32);
  if ((code >> 3) & 1u) w |= 1u << ((base + 15 - nvfp4_rot_sign(i) + 32) % 32);
  return w;
}

// Register i's bf16x2 bits (e2m1 · 2^-126 per half) from a packed word.
SERVAL_HOST_DEVICE constexpr uint32_t nvfp4_bf16x2_bits(uint32_t w, int i) {
  const int rs = nvfp4_rot_sign(i), rm = nvfp4_rot_mag(i);
  if (rs == rm) return rotl32(w, rs) & (kNvfp4SignBits | kNvfp4MagBits);
  return (rotl32(w, rs) & kNvfp4SignBits) | (rotl32(w, rm) & kNvfp4MagBits);
}

// nvfp4_word_bits for every (i, half, code): the packer's lookup table.
using Nvfp4WordTable = std::array<std::array<std::array<uint32_t, 16>, 2>, 4>;
constexpr Nvfp4WordTable make_nvfp4_word_table() {
  Nvfp4WordTable t{};
  for (int i = 0; i < 4; ++i)
    for (int half = 0; half < 2; ++half)
      for (uint32_t code = 0; code < 16; ++code)
        t[size_t(i)][size_t(half)][code] = nvfp4_word_bits(code, i, half);
  return t;
}

}  // namespace serval::kernels
