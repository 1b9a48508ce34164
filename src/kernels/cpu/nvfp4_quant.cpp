#include "kernels/cpu/nvfp4_quant.h"

#include <vector>

#include <cmath>
#include <cstring>
#include <string>

#include "base/error.h"

namespace serval::kernels::cpu {

uint8_t e2m1_encode_rne_satfinite(float v) {
  const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
  const float a = std::fabs(v);
  if (std::isnan(a)) return sign | 0x7;
  // Ties go to the even code: 0.25→0, 0.75→1.0, 1.25→1.0, 1.75→2.0, 2.5→2.0, 3.5→4.0, 5→4.0.
  const uint8_t mag = uint8_t((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                              (a >= 3.5f) + (a > 5.0f));
  return sign | mag;
}

float e2m1_decode(uint8_t code) {
  return e2m1_value(code);
}

namespace {

// Element i of the input as float, and its sign bit (bit 15 of both bf16 and f16).
struct Element {
  float value;
  bool negative;
};

Element load(const void* x, DType t, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, static_cast<const uint16_t*>(x) + i, 2);
  const float f = t == DType::kBF16 ? bf16_to_float(bf16{bits}) : f16_to_float(f16{bits});
  return {f, (bits & 0x8000u) != 0};
}

// Zeroes every SF byte outside the real [m, n/16] region (swizzled layout only).
void zero_sf_padding(const Nvfp4QuantParams& p) {
  const int64_t sf_cols_real = p.n / kNvfp4BlockSize;
  const int64_t rows = nvfp4_sf_rows(p.m, p.sf_layout);
  const int64_t cols = nvfp4_sf_cols(p.n, p.sf_layout);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      if (r >= p.m || k >= sf_cols_real) p.sf[nvfp4_sf_offset_128x4(r, k, sf_cols_real)] = 0;
    }
  }
}

}  // namespace

void nvfp4_quant(const Nvfp4QuantParams& p) {
  if (p.n <= 0 || p.n % kNvfp4BlockSize != 0 || p.m < 0)
    throw InvalidArgument("cpu nvfp4_quant: need m >= 0 and n > 0 a multiple of 16, got m=" +
                          std::to_string(p.m) + " n=" + std::to_string(p.n));
  if (p.x_dtype != DType::kBF16 && p.x_dtype != DType::kF16)
    throw InvalidArgument("cpu nvfp4_quant: x must be bfloat16 or float16, got " +
                          std::string(dtype_name(p.x_dtype)));
  const int64_t n = p.n, sf_cols_real = n / kNvfp4BlockSize;
  const float g = p.global_scale;
  if (nvfp4_sf_has_padding(p.m, p.n, p.sf_layout)) zero_sf_padding(p);

  for (int64_t r = 0; r < p.m; ++r) {
    for (int64_t b = 0; b < sf_cols_real; ++b) {
      Element e[kNvfp4BlockSize];
      float amax = 0.0f;
      for (int i = 0; i < kNvfp4BlockSize; ++i) {
        e[i] = load(p.x, p.x_dtype, r * n + b * kNvfp4BlockSize + i);
        amax = std::fmax(amax, std::fabs(e[i].value));  // fmax ignores NaN
      }
      const float sf_input = g * amax / 6.0f;
      const uint8_t sf = float_to_e4m3(sf_input);
      const float scale = sf == 0 ? 0.0f : g / e4m3_to_float(sf);
      uint8_t* q = p.q + r * (n / 2) + b * (kNvfp4BlockSize / 2);
      for (int i = 0; i < kNvfp4BlockSize; i += 2) {
        uint8_t nib[2] = {0, 0};
        if (sf != 0) {
          for (int j = 0; j < 2; ++j) {
            const float v = e[i + j].value * scale;
            nib[j] = uint8_t((e2m1_encode_rne_satfinite(v) & 0x7) | (e[i + j].negative ? 0x8 : 0));
          }
        }
        q[i / 2] = uint8_t(nib[0] | (nib[1] << 4));
      }
      const int64_t off = p.sf_layout == Nvfp4SfLayout::kSwizzled128x4
                              ? nvfp4_sf_offset_128x4(r, b, sf_cols_real)
                              : r * sf_cols_real + b;
      p.sf[off] = sf;
    }
  }
}

void nvfp4_fake_quant_rows(const float* x, int m, int n, float global_scale, float* out) {
  std::vector<bf16> row(static_cast<size_t>(n));
  std::vector<uint8_t> q(size_t(n) / 2), sf(size_t(n) / 16);
  for (int r = 0; r < m; ++r) {
    for (int i = 0; i < n; ++i) row[size_t(i)] = float_to_bf16(x[size_t(r) * n + i]);
    nvfp4_quant({row.data(), DType::kBF16, global_scale, q.data(), sf.data(),
                 Nvfp4SfLayout::kLinear, 1, n});
    for (int i = 0; i < n; ++i) {
      const uint8_t code = uint8_t((q[size_t(i) / 2] >> (4 * (i & 1))) & 0xF);
      out[size_t(r) * n + i] = e2m1_decode(code) * e4m3_to_float(sf[size_t(i) / 16]) / global_scale;
    }
  }
}

}  // namespace serval::kernels::cpu
