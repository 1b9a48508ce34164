// NVFP4 quantization, CPU side: the E2M1/E4M3 codecs against hand-computed values, the fast
// host/device codecs of nvfp4_layout.h against the plain references over wide float sweeps, the
// 128x4 swizzle offsets, and the CPU quantizer on hand-computed blocks.
#include "kernels/cpu/nvfp4_quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "base/error.h"

namespace serval::kernels {
namespace {

using cpu::e2m1_decode;
using cpu::e2m1_encode_rne_satfinite;

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::bit_cast<float>(0x7FC00000u);

float next_up(float f) {
  return std::nextafter(f, kInf);
}
float next_down(float f) {
  return std::nextafter(f, -kInf);
}

TEST(Nvfp4Codec, E2M1EncodeAtEveryTie) {
  struct Case {
    float v;
    uint8_t code;
  };
  const Case cases[] = {
      {0.0f, 0x0},           {0.25f, 0x0},  // tie 0 / 0.5 -> even code 0
      {next_up(0.25f), 0x1}, {0.5f, 0x1},  {next_down(0.75f), 0x1},
      {0.75f, 0x2},                         // tie 0.5 / 1 -> 1
      {1.0f, 0x2},           {1.25f, 0x2},  // tie 1 / 1.5 -> 1
      {next_up(1.25f), 0x3}, {1.5f, 0x3},  {next_down(1.75f), 0x3},
      {1.75f, 0x4},                        // tie 1.5 / 2 -> 2
      {2.0f, 0x4},           {2.5f, 0x4},  // tie 2 / 3 -> 2
      {next_up(2.5f), 0x5},  {3.0f, 0x5},  {next_down(3.5f), 0x5},
      {3.5f, 0x6},                         // tie 3 / 4 -> 4
      {4.0f, 0x6},           {5.0f, 0x6},  // tie 4 / 6 -> 4
      {next_up(5.0f), 0x7},  {6.0f, 0x7},  {7.0f, 0x7},
      {1e30f, 0x7},          {kInf, 0x7},  {kNaN, 0x7},
      {-0.0f, 0x8},          {-0.1f, 0x8}, {-0.3f, 0x9},
      {-1.75f, 0xC},         {-5.0f, 0xE}, {-kInf, 0xF},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(e2m1_encode_rne_satfinite(c.v), c.code) << "v=" << c.v;
  }
}

TEST(Nvfp4Codec, E2M1DecodeAndRoundTrip) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_decode(uint8_t(c)), want[c]) << "code " << c;
    EXPECT_EQ(std::signbit(e2m1_decode(uint8_t(c))), c >= 8) << "code " << c;
    EXPECT_EQ(e2m1_encode_rne_satfinite(e2m1_decode(uint8_t(c))), c) << "code " << c;
  }
}

// The add-trick magnitude used on the GPU must equal the compare table for every float it can
// meet; sweep all bit patterns below 8 with a small stride plus every threshold neighbourhood.
TEST(Nvfp4Codec, FastE2M1MagnitudeMatchesTable) {
  auto check = [](float v) {
    const uint32_t want = e2m1_encode_rne_satfinite(v) & 7u;
    const uint32_t got = e2m1_magnitude_rne_satfinite(v);
    if (got != want)
      ADD_FAILURE() << "v=" << v << " bits=" << std::bit_cast<uint32_t>(v) << " fast=" << got
                    << " table=" << want;
    return got == want;
  };
  int failures = 0;
  for (uint32_t b = 0; b <= 0x41000000u && failures < 10; b += 37) {
    failures += !check(std::bit_cast<float>(b));
  }
  for (uint32_t b = 0x41000000u; b < 0x7F800000u; b += 65537) check(std::bit_cast<float>(b));
  for (float t : {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f,
                  6.0f, 7.0f, 8.0f}) {
    const uint32_t tb = std::bit_cast<uint32_t>(t);
    for (uint32_t d = 0; d <= 64; ++d) {
      check(std::bit_cast<float>(tb + d));
      check(std::bit_cast<float>(tb - d));
      check(-std::bit_cast<float>(tb - d));
    }
  }
  for (float v : {0.0f, -0.0f, 1e-45f, 1e-38f, kInf, -kInf, kNaN, -kNaN, 3e38f}) check(v);
}

TEST(Nvfp4Codec, FastE4M3MatchesReference) {
  auto check = [](float v) {
    const uint8_t want = float_to_e4m3(v), got = e4m3_encode_rne_satfinite(v);
    if (got != want)
      ADD_FAILURE() << "v=" << v << " bits=" << std::bit_cast<uint32_t>(v) << " fast=" << int(got)
                    << " ref=" << int(want);
    return got == want;
  };
  int failures = 0;
  // All of [0, 1024) with a stride, then sparse above (saturation), then negatives.
  for (uint32_t b = 0; b < 0x44800000u && failures < 10; b += 211) {
    failures += !check(std::bit_cast<float>(b));
  }
  for (uint32_t b = 0x44800000u; b < 0x7F800000u; b += 65539) check(std::bit_cast<float>(b));
  for (uint32_t b = 0x80000000u; b < 0xC4800000u; b += 100003) check(std::bit_cast<float>(b));
  // Every representable value and every midpoint between neighbours, +- a few ulps.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_float(uint8_t(c)), hi = e4m3_to_float(uint8_t(c + 1));
    for (float t : {lo, (lo + hi) / 2}) {
      const uint32_t tb = std::bit_cast<uint32_t>(t);
      for (uint32_t d = 0; d <= 3; ++d) {
        check(std::bit_cast<float>(tb + d));
        if (tb >= d) check(std::bit_cast<float>(tb - d));
      }
    }
  }
  for (float v :
       {0.0f, -0.0f, 448.0f, 464.0f, next_down(464.0f), 480.0f, 1e-45f, kInf, -kInf, kNaN, -kNaN}) {
    check(v);
  }
}

TEST(Nvfp4Codec, FastE4M3DecodeMatchesReference) {
  for (int c = 0; c < 256; ++c) {
    const float want = e4m3_to_float(uint8_t(c)), got = e4m3_decode(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "code " << c;
    }
  }
}

TEST(Nvfp4Layout, SwizzleOffsetsHandComputed) {
  // 5 real SF columns -> Kt = 2 tiles of 4 columns, 512 bytes per 128x4 tile.
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(0, 0, 5), 0);
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(1, 0, 5), 16);
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(31, 2, 5), 31 * 16 + 2);
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(32, 0, 5), 4);
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(127, 3, 5), 496 + 12 + 3);
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(0, 4, 5), 512);
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(65, 7, 5), 512 + 16 + 8 + 3);
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(128, 0, 5), 1024);
  EXPECT_EQ(nvfp4_sf_offset_128x4<int64_t>(130, 4, 5), 1024 + 512 + 32);
  EXPECT_EQ(nvfp4_sf_offset_128x4<uint32_t>(130, 4, 5), 1024u + 512 + 32);
  EXPECT_EQ(nvfp4_sf_bytes(129, 80, Nvfp4SfLayout::kSwizzled128x4), 256 * 8);
  EXPECT_EQ(nvfp4_sf_bytes(129, 80, Nvfp4SfLayout::kLinear), 129 * 5);
  EXPECT_TRUE(nvfp4_sf_has_padding(128, 80, Nvfp4SfLayout::kSwizzled128x4));
  EXPECT_TRUE(nvfp4_sf_has_padding(1, 64, Nvfp4SfLayout::kSwizzled128x4));
  EXPECT_FALSE(nvfp4_sf_has_padding(256, 64, Nvfp4SfLayout::kSwizzled128x4));
  EXPECT_FALSE(nvfp4_sf_has_padding(1, 80, Nvfp4SfLayout::kLinear));
}

TEST(Nvfp4Layout, SwizzleIsABijectionOntoTheBuffer) {
  const int64_t rows = 256, cols = 12;  // 3 column tiles
  std::set<int64_t> seen;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t off = nvfp4_sf_offset_128x4(r, k, cols);
      ASSERT_GE(off, 0);
      ASSERT_LT(off, rows * cols);
      ASSERT_TRUE(seen.insert(off).second) << "row " << r << " col " << k << " collides";
    }
}

// --- the CPU quantizer ---------------------------------------------------------------------

struct Result {
  std::vector<uint8_t> q, sf;
};

Result quantize(const std::vector<float>& x, int m, int n, float g, Nvfp4SfLayout layout,
                DType dtype = DType::kBF16) {
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    bits[i] = dtype == DType::kBF16 ? float_to_bf16(x[i]).bits : float_to_f16(x[i]).bits;
  Result r{std::vector<uint8_t>(size_t(m) * n / 2, 0xAB),
           std::vector<uint8_t>(nvfp4_sf_bytes(m, n, layout), 0xAB)};
  cpu::nvfp4_quant({bits.data(), dtype, g, r.q.data(), r.sf.data(), layout, m, n});
  return r;
}

Result quantize_block(const std::vector<float>& block, float g) {
  return quantize(block, 1, 16, g, Nvfp4SfLayout::kLinear);
}

// With g = 6 and amax = 6: sf_in = 6 exactly (e4m3 0x4C = 1.5·2^2), scale = 1, so the codes are
// the E2M1 table itself; checks ties, signs and packing order (element 2i = low nibble).
TEST(Nvfp4QuantCpu, TiesSignsAndPacking) {
  const std::vector<float> block = {6,      0.25f,  0.75f, 1.25f, 1.75f, 2.5f, 3.5f,  5,
                                    -0.25f, -0.75f, -5,    0.3f,  2.6f,  0,    -0.0f, 5.5f};
  Result r = quantize_block(block, 6.0f);
  EXPECT_EQ(r.sf[0], 0x4C);
  const std::vector<uint8_t> want = {0x07, 0x22, 0x44, 0x66, 0xA8, 0x1E, 0x05, 0x78};
  EXPECT_EQ(r.q, want);

  // Just above / below each tie (neighbouring bf16 values), scale still exactly 1.
  const std::vector<float> near = {6,          0.251953125f, 0.74609375f,  1.2578125f,
                                   1.7421875f, 2.515625f,    3.484375f,    5.03125f,
                                   4.96875f,   -2.515625f,   -0.74609375f, 0.248046875f,
                                   1.0f,       1.5f,         3.0f,         4.0f};
  r = quantize_block(near, 6.0f);
  EXPECT_EQ(r.sf[0], 0x4C);
  const std::vector<uint8_t> want_near = {0x17, 0x31, 0x53, 0x75, 0xD6, 0x09, 0x32, 0x65};
  EXPECT_EQ(r.q, want_near);
}

TEST(Nvfp4QuantCpu, ZeroBlockGivesZeroScaleAndCodes) {
  std::vector<float> block(16, 0.0f);
  block[3] = -0.0f;  // would be code 0x8 if sf were non-zero
  Result r = quantize_block(block, 1234.5f);
  EXPECT_EQ(r.sf[0], 0x00);
  EXPECT_EQ(r.q, std::vector<uint8_t>(8, 0x00));
}

TEST(Nvfp4QuantCpu, ScaleSaturatesAt448) {
  // g·amax/6 = 1000 -> sf 448 (0x7E); scale = 6/448.
  std::vector<float> block(16, 0.0f);
  block[0] = 1000;  // v = 13.4 -> 6 (code 7)
  block[1] = 100;   // v = 1.339 -> 1.5 (3)
  block[2] = 10;    // v = 0.134 -> 0
  block[3] = 40;    // v = 0.536 -> 0.5 (1)
  block[4] = -200;  // v = -2.68 -> -3 (0xD)
  Result r = quantize_block(block, 6.0f);
  EXPECT_EQ(r.sf[0], 0x7E);
  EXPECT_EQ(r.q[0], 0x37);
  EXPECT_EQ(r.q[1], 0x10);
  EXPECT_EQ(r.q[2], 0x0D);
  for (int i = 3; i < 8; ++i) EXPECT_EQ(r.q[i], 0x00) << i;
}

TEST(Nvfp4QuantCpu, ScaleRoundingAndSubnormalScales) {
  // bf16(1.1) = 1.1015625 -> e4m3 RNE 1.125 (0x39); scale = 6/1.125; 1.1015625·5.333 = 5.875 -> 6.
  Result r = quantize_block(std::vector<float>(16, 1.1f), 6.0f);
  EXPECT_EQ(r.sf[0], 0x39);
  EXPECT_EQ(r.q, std::vector<uint8_t>(8, 0x77));
  // amax 2^-8 -> sf subnormal 2·2^-9 (0x02); scale = 6/2^-8 -> the amax element is 6 (7).
  std::vector<float> block(16, 0.0f);
  block[1] = std::ldexp(1.0f, -8);
  r = quantize_block(block, 6.0f);
  EXPECT_EQ(r.sf[0], 0x02);
  EXPECT_EQ(r.q[0], 0x70);
  // amax 2^-10: half the smallest subnormal, a tie -> sf 0 and all codes 0.
  block[1] = std::ldexp(1.0f, -10);
  r = quantize_block(block, 6.0f);
  EXPECT_EQ(r.sf[0], 0x00);
  EXPECT_EQ(r.q, std::vector<uint8_t>(8, 0x00));
  // amax 1.5·2^-9: tie between 1 and 2 subnormal steps -> 2 (0x02).
  block[1] = 1.5f * std::ldexp(1.0f, -9);
  r = quantize_block(block, 6.0f);
  EXPECT_EQ(r.sf[0], 0x02);
}

TEST(Nvfp4QuantCpu, InfAndNaNAsDocumented) {
  std::vector<float> block(16, 0.0f);
  block[0] = kInf;   // amax inf -> sf 448, inf -> 6 (7)
  block[1] = 1;      // v = 0.013 -> 0
  block[2] = -2;     // v = -0.027 -> -0 (0x8)
  block[3] = kNaN;   // -> 6 (7)
  block[4] = -kNaN;  // -> -6 (0xF)
  Result r = quantize_block(block, 6.0f);
  EXPECT_EQ(r.sf[0], 0x7E);
  EXPECT_EQ(r.q[0], 0x07);
  EXPECT_EQ(r.q[1], 0x78);
  EXPECT_EQ(r.q[2], 0x0F);

  // NaN is ignored by amax: a NaN among zeros gives sf 0 and an all-zero block.
  std::fill(block.begin(), block.end(), 0.0f);
  block[5] = kNaN;
  r = quantize_block(block, 6.0f);
  EXPECT_EQ(r.sf[0], 0x00);
  EXPECT_EQ(r.q, std::vector<uint8_t>(8, 0x00));

  // NaN next to finite values: amax 3 -> sf 3 (0x44), scale 2; NaN -> 7, 3 -> 6 (7).
  block[4] = 3;
  r = quantize_block(block, 6.0f);
  EXPECT_EQ(r.sf[0], 0x44);
  EXPECT_EQ(r.q[2], 0x07 << 4 | 0x07);
}

TEST(Nvfp4QuantCpu, SwizzledLayoutWritesRealBytesAndZeroPadding) {
  const int m = 3, n = 80;  // 5 SF columns -> buffer 128 rows x 8 columns
  std::vector<float> x(size_t(m) * n);
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) x[r * n + c] = (c % 16 == 0) ? float(1 + r + c / 16) : 0.5f;
  const float g = 6.0f;  // sf = e4m3(amax) = 1 + r + b exactly
  Result swz = quantize(x, m, n, g, Nvfp4SfLayout::kSwizzled128x4);
  Result lin = quantize(x, m, n, g, Nvfp4SfLayout::kLinear);
  ASSERT_EQ(swz.sf.size(), 128u * 8);
  ASSERT_EQ(lin.sf.size(), size_t(m) * 5);
  EXPECT_EQ(swz.q, lin.q);
  for (int r = 0; r < 128; ++r)
    for (int k = 0; k < 8; ++k) {
      const uint8_t got = swz.sf[nvfp4_sf_offset_128x4(r, k, 5)];
      if (r < m && k < 5) {
        EXPECT_EQ(got, float_to_e4m3(float(1 + r + k))) << r << "," << k;
        EXPECT_EQ(lin.sf[r * 5 + k], got) << r << "," << k;
      } else {
        EXPECT_EQ(got, 0x00) << "padding " << r << "," << k;
      }
    }
}

TEST(Nvfp4QuantCpu, Float16InputMatchesBf16ForSharedValues) {
  std::vector<float> x(2 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7 % 23) - 11) * 0.125f;
  Result a = quantize(x, 2, 32, 3.5f, Nvfp4SfLayout::kLinear, DType::kBF16);
  Result b = quantize(x, 2, 32, 3.5f, Nvfp4SfLayout::kLinear, DType::kF16);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.sf, b.sf);
}

TEST(Nvfp4QuantCpu, RejectsBadShapesAndTypes) {
  std::vector<uint16_t> x(64);
  std::vector<uint8_t> q(64), sf(4096);
  EXPECT_THROW(cpu::nvfp4_quant({x.data(), DType::kBF16, 1.0f, q.data(), sf.data(),
                                 Nvfp4SfLayout::kLinear, 1, 24}),
               InvalidArgument);
  EXPECT_THROW(cpu::nvfp4_quant({x.data(), DType::kF32, 1.0f, q.data(), sf.data(),
                                 Nvfp4SfLayout::kLinear, 1, 16}),
               InvalidArgument);
}

}  // namespace
}  // namespace serval::kernels
