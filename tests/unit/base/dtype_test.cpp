#include "base/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "base/math.h"

namespace serval {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.00390625f).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(1.01171875f).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DType, F16MatchesCompilerConversion) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) {
    float x = dist(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
    _Float16 h = static_cast<_Float16>(x);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    ASSERT_EQ(float_to_f16(x).bits, bits) << x;
    ASSERT_EQ(f16_to_float(f16{bits}), static_cast<float>(h));
  }
}

TEST(DType, E4m3AllCodesRoundTrip) {
  for (int v = 0; v < 256; ++v) {
    float f = e4m3_to_float(uint8_t(v));
    if (std::isnan(f)) continue;
    if (f == 0.0f) continue;  // +-0
    EXPECT_EQ(float_to_e4m3(f), v) << v;
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(float_to_e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(DType, E5m2AllCodesRoundTrip) {
  for (int v = 0; v < 256; ++v) {
    float f = e5m2_to_float(uint8_t(v));
    if (std::isnan(f) || std::isinf(f) || f == 0.0f) continue;
    EXPECT_EQ(float_to_e5m2(f), v) << v;
  }
}

TEST(Math, RoundUp) {
  static_assert(round_up(1000, 128) == 1024);
  EXPECT_EQ(ceil_div(4112 / 16, 4), 65);
}

}  // namespace
}  // namespace serval
