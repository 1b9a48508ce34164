// Helpers of the fp8 KV-cache GPU tests: encode/decode of a cache element by dtype (bf16, e4m3,
// e5m2, through the serval::float_to_* oracles), its rounding step, and seeded random inputs
// that cover the whole fp8 range (subnormals, zeros, the saturation bound).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "base/dtype.h"

namespace serval::testing {

inline bool is_fp8(DType t) {
  return t == DType::kF8E4M3 || t == DType::kF8E5M2;
}

inline int cache_elem_bytes(DType t) {
  return is_fp8(t) ? 1 : 2;
}

// Largest finite value of a cache dtype.
inline float cache_max(DType t) {
  switch (t) {
    case DType::kF8E4M3:
      return 448.0f;
    case DType::kF8E5M2:
      return 57344.0f;
    case DType::kBF16:
      return 3.38953139e38f;
    default:
      throw std::invalid_argument("cache_max: not a KV cache dtype");
  }
}

// Element i of a cache byte buffer as float.
inline float cache_decode(DType t, const std::vector<uint8_t>& bytes, size_t i) {
  switch (t) {
    case DType::kF8E4M3:
      return e4m3_to_float(bytes[i]);
    case DType::kF8E5M2:
      return e5m2_to_float(bytes[i]);
    case DType::kBF16:
      return bf16_to_float(bf16{uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8))});
    default:
      throw std::invalid_argument("cache_decode: not a KV cache dtype");
  }
}

inline uint8_t fp8_encode(DType t, float x) {
  return t == DType::kF8E4M3 ? float_to_e4m3(x) : float_to_e5m2(x);
}

// Distance between adjacent representable values at magnitude `mag` (the larger neighbour's
// binade): one rounding step of the cache format.
inline float cache_step(DType t, float mag) {
  const int mant_bits = t == DType::kF8E4M3 ? 3 : t == DType::kF8E5M2 ? 2 : 7;
  const int min_exp = t == DType::kF8E4M3 ? -6 : t == DType::kF8E5M2 ? -14 : -126;
  int e = mag > 0.0f ? int(std::floor(std::log2(mag))) : min_exp;
  if (e < min_exp) e = min_exp;
  return std::ldexp(1.0f, e - mant_bits);
}

// True for the codes that decode to a finite value.
inline bool fp8_finite(DType t, uint8_t b) {
  if (t == DType::kF8E4M3) return (b & 0x7F) != 0x7F;
  return (b & 0x7C) != 0x7C;  // e5m2: exponent 31 is inf/NaN
}

// Signed values whose magnitudes are log-uniform in [scale·2^lo_exp, scale·2^hi_exp].
inline std::vector<float> log_uniform(size_t n, uint32_t seed, float scale, float lo_exp,
                                      float hi_exp) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> e(lo_exp, hi_exp);
  std::vector<float> v(n);
  for (auto& x : v) x = (rng() & 1 ? -scale : scale) * std::exp2(e(rng));
  return v;
}

// n fp8 codes, all finite: half uniformly random finite codes (every binade, subnormals and
// zeros included), half encode(u / scale) of u uniform in [-1, 1) (so code · scale ≈ u).
inline std::vector<uint8_t> random_fp8(size_t n, DType t, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    if (rng() & 1) {
      do {
        b = uint8_t(rng());
      } while (!fp8_finite(t, b));
    } else {
      b = fp8_encode(t, u(rng) / scale);
    }
  }
  return v;
}

}  // namespace serval::testing
