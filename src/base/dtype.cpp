#include "base/dtype.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace serval {

int dtype_bits(DType t) {
  switch (t) {
    case DType::kF32:
      return 32;
    case DType::kF16:
      return 16;
    case DType::kBF16:
      return 16;
    case DType::kF8E4M3:
      return 8;
    case DType::kF8E5M2:
      return 8;
    case DType::kF4E2M1:
      return 4;
    case DType::kUE8M0:
      return 8;
    case DType::kU8:
      return 8;
    case DType::kI8:
      return 8;
    case DType::kI16:
      return 16;
    case DType::kI32:
      return 32;
    case DType::kI64:
      return 64;
    case DType::kF64:
      return 64;
    case DType::kBool:
      return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
    case DType::kF8E5M2:
      return "float8_e5m2";
    case DType::kF4E2M1:
      return "float4_e2m1";
    case DType::kUE8M0:
      return "ue8m0";
    case DType::kU8:
      return "uint8";
    case DType::kI8:
      return "int8";
    case DType::kI16:
      return "int16";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kF64:
      return "float64";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

bool dtype_from_safetensors(std::string_view s, DType* out) {
  struct Entry {
    std::string_view name;
    DType type;
  };
  static constexpr Entry kTable[] = {
      {"F32", DType::kF32},        {"F16", DType::kF16},        {"BF16", DType::kBF16},
      {"F8_E4M3", DType::kF8E4M3}, {"F8_E5M2", DType::kF8E5M2}, {"F8_E8M0", DType::kUE8M0},
      {"U8", DType::kU8},          {"I8", DType::kI8},          {"I16", DType::kI16},
      {"I32", DType::kI32},        {"I64", DType::kI64},        {"F64", DType::kF64},
      {"BOOL", DType::kBool},
  };
  for (const Entry& e : kTable) {
    if (e.name == s) {
      *out = e.type;
      return true;
    }
  }
  return false;
}

bool dtype_from_torch_name(std::string_view s, DType* out) {
  if (s == "bfloat16" || s == "bf16") {
    *out = DType::kBF16;
  } else if (s == "float16" || s == "half" || s == "fp16") {
    *out = DType::kF16;
  } else if (s == "float32" || s == "float" || s == "fp32") {
    *out = DType::kF32;
  } else {
    return false;
  }
  return true;
}

float f16_to_float(f16 v) {
  uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};
  if (abs >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                       // below 2^-14: subnormal or zero
    float a;
    std::memcpy(&a, &abs, 4);
    // Scale so that one f16 subnormal ulp (2^-24) becomes 1, then round to nearest even.
    float scaled = a * 16777216.0f;
    uint32_t m = uint32_t(std::nearbyint(scaled));
    return f16{uint16_t(sign | m)};
  }
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t mant = abs & 0x7fffffu;
  uint32_t h = exp << 10 | mant >> 13;
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return f16{uint16_t(sign | h)};
}

namespace {

// Generic minifloat decode: `exp_bits`, `man_bits`, bias; no inf (e4m3fn) or IEEE-like (e5m2).
float decode_minifloat(uint32_t v, int exp_bits, int man_bits, int bias) {
  uint32_t sign = v >> (exp_bits + man_bits);
  uint32_t exp = (v >> man_bits) & ((1u << exp_bits) - 1);
  uint32_t mant = v & ((1u << man_bits) - 1);
  float mag;
  if (exp == 0) {
    mag = std::ldexp(float(mant), 1 - bias - man_bits);
  } else {
    mag = std::ldexp(float(mant | (1u << man_bits)), int(exp) - bias - man_bits);
  }
  return sign ? -mag : mag;
}

}  // namespace

float e4m3_to_float(uint8_t v) {
  if ((v & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  return decode_minifloat(v, 4, 3, 7);
}

float e5m2_to_float(uint8_t v) {
  uint32_t exp = (v >> 2) & 0x1f;
  if (exp == 0x1f) {
    if (v & 3) return std::numeric_limits<float>::quiet_NaN();
    return (v & 0x80) ? -std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::infinity();
  }
  return decode_minifloat(v, 5, 2, 15);
}

uint8_t float_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate (satfinite)
  // Smallest normal is 2^-6; subnormal step is 2^-9.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp_unbiased = e - 1;
  if (exp_unbiased < -6) exp_unbiased = -6;
  float step = std::ldexp(1.0f, exp_unbiased - 3);
  float q = std::nearbyint(a / step) * step;  // ties to even (default rounding mode)
  if (q >= 448.0f) return sign | 0x7e;
  if (q == 0.0f) return sign;
  int qe;
  std::frexp(q, &qe);
  int qexp = qe - 1;
  if (qexp < -6) {  // subnormal
    return sign | uint8_t(std::lround(q / std::ldexp(1.0f, -9)));
  }
  uint32_t mant = uint32_t(std::lround(std::ldexp(q, -qexp) * 8.0f)) - 8u;
  return sign | uint8_t((qexp + 7) << 3) | uint8_t(mant);
}

uint8_t float_to_e5m2(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 57344.0f) return sign | 0x7b;  // saturate to max finite
  int e;
  std::frexp(a, &e);
  int exp_unbiased = e - 1;
  if (exp_unbiased < -14) exp_unbiased = -14;
  float step = std::ldexp(1.0f, exp_unbiased - 2);
  float q = std::nearbyint(a / step) * step;
  if (q >= 57344.0f) return sign | 0x7b;
  if (q == 0.0f) return sign;
  int qe;
  std::frexp(q, &qe);
  int qexp = qe - 1;
  if (qexp < -14) return sign | uint8_t(std::lround(q / std::ldexp(1.0f, -16)));
  uint32_t mant = uint32_t(std::lround(std::ldexp(q, -qexp) * 4.0f)) - 4u;
  return sign | uint8_t((qexp + 15) << 2) | uint8_t(mant);
}

namespace {

// Checkpoint data may be unaligned (safetensors headers need not be padded).
template <typename T>
T load_unaligned(const void* data, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(data) + i * sizeof(T), sizeof(T));
  return v;
}

}  // namespace

float load_as_float(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return load_unaligned<float>(data, i);
    case DType::kF16:
      return f16_to_float(load_unaligned<f16>(data, i));
    case DType::kBF16:
      return bf16_to_float(load_unaligned<bf16>(data, i));
    case DType::kF8E4M3:
      return e4m3_to_float(static_cast<const uint8_t*>(data)[i]);
    case DType::kF8E5M2:
      return e5m2_to_float(static_cast<const uint8_t*>(data)[i]);
    case DType::kF64:
      return float(load_unaligned<double>(data, i));
    case DType::kF4E2M1:
    case DType::kUE8M0:
    case DType::kU8:
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      break;
  }
  throw std::invalid_argument("load_as_float: not a float dtype");
}

}  // namespace serval
