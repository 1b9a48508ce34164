// NVFP4 storage layout shared by host and device code: scale-factor (SF) buffer shapes, the
// 128x4 swizzle offset (SPEC §2.2), and the bit-exact scalar codecs (E2M1 magnitude, E4M3
// encode/decode) that the CUDA quantizer uses. The CPU unit test checks these codecs against the
// plain reference codecs (kernels/cpu/nvfp4_quant.h, base/dtype.h) over wide input ranges, so the
// GPU kernel inherits their bit-exactness.
#pragma once
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>

#include "base/math.h"

// The one preprocessor spot: host+device attribute when compiled by nvcc, nothing for g++.
#ifndef SERVAL_HOST_DEVICE
#ifdef __CUDACC__
#define SERVAL_HOST_DEVICE __host__ __device__
#else
#define SERVAL_HOST_DEVICE
#endif
#endif

namespace serval::kernels {

// Elements sharing one E4M3 scale factor.
inline constexpr int kNvfp4BlockSize = 16;

// Where the SF bytes go. kSwizzled128x4: the tiled layout the NVFP4 GEMMs read, padded to
// round_up(m, 128) rows x round_up(n/16, 4) columns (padding bytes are 0). kLinear: [m, n/16]
// row-major, no padding (small-M kernels).
enum class Nvfp4SfLayout : uint8_t { kSwizzled128x4, kLinear };

// Byte offset of the SF of row `row`, SF column `sf_col` (= element column / 16) in the 128x4
// swizzled layout of a matrix with `sf_cols` real SF columns (n/16). Each 128-row x 4-column tile
// owns 512 contiguous bytes: (row/128)·Kt·512 + (sf_col/4)·512 + (row%32)·16 + ((row%128)/32)·4
// + sf_col%4, Kt = ceil(sf_cols/4).
template <std::integral Int>
SERVAL_HOST_DEVICE constexpr Int nvfp4_sf_offset_128x4(Int row, Int sf_col, Int sf_cols) {
  const Int k_tiles = ceil_div(sf_cols, Int{4});
  return (row / 128) * k_tiles * 512 + (sf_col / 4) * 512 + (row % 32) * 16 +
         ((row % 128) / 32) * 4 + sf_col % 4;
}

// SF buffer rows / columns / bytes for an [m, n] input (n % 16 == 0).
SERVAL_HOST_DEVICE constexpr int64_t nvfp4_sf_rows(int64_t m, Nvfp4SfLayout layout) {
  return layout == Nvfp4SfLayout::kSwizzled128x4 ? round_up(m, int64_t{128}) : m;
}
SERVAL_HOST_DEVICE constexpr int64_t nvfp4_sf_cols(int64_t n, Nvfp4SfLayout layout) {
  return layout == Nvfp4SfLayout::kSwizzled128x4 ? round_up(n / kNvfp4BlockSize, int64_t{4})
                                                 : n / kNvfp4BlockSize;
}
SERVAL_HOST_DEVICE constexpr int64_t nvfp4_sf_bytes(int64_t m, int64_t n, Nvfp4SfLayout layout) {
  return nvfp4_sf_rows(m, layout) * nvfp4_sf_cols(n, layout);
}
// True when the SF buffer has padding bytes (which the quantizer must zero).
SERVAL_HOST_DEVICE constexpr bool nvfp4_sf_has_padding(int64_t m, int64_t n, Nvfp4SfLayout layout) {
  return layout == Nvfp4SfLayout::kSwizzled128x4 &&
         (m % 128 != 0 || (n / kNvfp4BlockSize) % 4 != 0);
}

static_assert(nvfp4_sf_offset_128x4(0, 0, 4) == 0);
static_assert(nvfp4_sf_offset_128x4(1, 0, 4) == 16);
static_assert(nvfp4_sf_offset_128x4(32, 0, 4) == 4);
static_assert(nvfp4_sf_offset_128x4(33, 3, 4) == 16 + 4 + 3);
static_assert(nvfp4_sf_offset_128x4(0, 4, 8) == 512);
static_assert(nvfp4_sf_offset_128x4(128, 0, 5) == 1024);  // Kt = 2
static_assert(nvfp4_sf_bytes(129, 4112, Nvfp4SfLayout::kSwizzled128x4) == 256 * 260);

// E2M1 magnitude code (0..7 for 0, .5, 1, 1.5, 2, 3, 4, 6) of |v| rounded to nearest even and
// saturated to 6; a quiet NaN gives 7 (v must not be a signaling NaN: products never are). Same
// result as the compare table of SPEC §2.2, computed with one float add: for a = min(|v|, 6) with
// biased exponent e (at least 127), M = 1.5·2^(e-127+22) has an ulp equal to the E2M1 step at a
// (0.5 below 2, 1 in [2,4), 2 in [4,6]) and is an even multiple of it, so the single IEEE rounding
// of a + M is exactly RNE of a onto the E2M1 grid. The sum's low bits count the steps k (<= 4) and
// its bits above 22 are 2e + 45, so the code is k + 2(e - 127). Needs IEEE round-to-nearest adds
// without FTZ (nvcc without -use_fast_math, x86-64 SSE on the host).
SERVAL_HOST_DEVICE inline uint32_t e2m1_magnitude_rne_satfinite(float v) {
  const float a = fminf(fabsf(v), 6.0f);  // fminf(NaN, 6) = 6
  const uint32_t a_bits = std::bit_cast<uint32_t>(a);
  const uint32_t b = a_bits > 0x3F800000u ? a_bits : 0x3F800000u;  // exponent at least 2^0's
  const float m = std::bit_cast<float>((b & 0xFF800000u) + 0x0B400000u);
  const uint32_t s = std::bit_cast<uint32_t>(a + m);
  return (s & 0xFu) + (s >> 22) - 299u;
}

// Value of the E2M1 code in the low nibble of `code` (bit 3 = sign: code 8 is -0.0). Exact.
SERVAL_HOST_DEVICE inline float e2m1_value(uint32_t code) {
  constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMagnitude[code & 7u];
  return (code & 8u) ? -v : v;
}

// E4M3 (e4m3fn) encode, round to nearest even, saturating to ±448 (inf too); NaN -> 0x7F.
// Bit-identical to serval::float_to_e4m3 (base/dtype.h); same add trick as above with the E4M3
// step 2^(e-3), e >= -6 (subnormal step 2^-9).
SERVAL_HOST_DEVICE inline uint8_t e4m3_encode_rne_satfinite(float x) {
  const uint32_t x_bits = std::bit_cast<uint32_t>(x);
  if ((x_bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7F;
  const uint32_t sign = (x_bits >> 24) & 0x80u;
  const float a = fminf(fabsf(x), 448.0f);
  const uint32_t bits = std::bit_cast<uint32_t>(a);
  const uint32_t e = (bits > 0x3C800000u ? bits : 0x3C800000u) >> 23;  // 121 (2^-6)..135
  const uint32_t m_bits = ((e + 20u) << 23) | 0x400000u;
  const uint32_t k = std::bit_cast<uint32_t>(a + std::bit_cast<float>(m_bits)) - m_bits;
  return uint8_t(sign | (((e - 120u) << 3) + k - 8u));
}

// E4M3 (e4m3fn) decode; 0x7F / 0xFF are NaN. Exact; bit-identical to serval::e4m3_to_float.
SERVAL_HOST_DEVICE inline float e4m3_decode(uint8_t b) {
  const uint32_t mag = b & 0x7Fu;
  if (mag == 0x7Fu) return std::bit_cast<float>(0x7FC00000u);
  const uint32_t e = mag >> 3, m = mag & 7u;
  const float f = e == 0 ? float(m) * 0.001953125f  // m · 2^-9
                         : std::bit_cast<float>(((e + 120u) << 23) | (m << 20));
  return (b & 0x80u) ? -f : f;
}

}  // namespace serval::kernels
