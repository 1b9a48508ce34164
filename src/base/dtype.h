// Element types serval stores and computes with, and scalar conversions to and from float.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace serval {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // e4m3fn: bias 7, max 448, 0x7F/0xFF NaN, no inf
  kF8E5M2,
  kF4E2M1,  // two per byte, element 2i in the low nibble
  kUE8M0,   // power-of-two scale byte
  kU8,
  kI8,
  kI16,
  kI32,
  kI64,
  kF64,
  kBool,
};

// Bits per element (4 for kF4E2M1, which packs two per byte).
int dtype_bits(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("BF16", "F8_E4M3", ...). Returns false if unknown.
bool dtype_from_safetensors(std::string_view s, DType* out);
// Parses a config/CLI dtype ("bfloat16", "float16", "float32", "auto" is not a dtype).
bool dtype_from_torch_name(std::string_view s, DType* out);

// Storage types with explicit bit patterns.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

float f16_to_float(f16 v);
f16 float_to_f16(float f);  // round to nearest even, overflow to inf

// e4m3fn decode/encode (encode: round to nearest even, saturate to +-448, NaN -> 0x7F).
float e4m3_to_float(uint8_t v);
uint8_t float_to_e4m3(float f);
float e5m2_to_float(uint8_t v);
uint8_t float_to_e5m2(float f);

// Reads element i of a buffer of type t as float (t must be a float type, not packed fp4).
float load_as_float(const void* data, DType t, size_t i);

}  // namespace serval
