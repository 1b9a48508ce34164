// The CPU quantized linear (NVFP4, FP8 per-tensor / per-channel / block) against the dense CPU
// linear on weights dequantized here, independently, from the SPEC §2 formulas. The kernel
// dequantizes in the same float order and uses the same dot product, so the results must be
// bit-exact (EXPECT_EQ on floats), not merely close.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "base/dtype.h"
#include "kernels/cpu/nvfp4_quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_linear.h"
#include "model/weight_source.h"

namespace serval {
namespace {

using kernels::WeightFormat;

float e2m1_value(uint8_t nibble) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (nibble & 8 ? -1.0f : 1.0f) * kMag[nibble & 7];
}

struct Case {
  WeightFormat format;
  int n, k;
  int block_n = 128, block_k = 128;
};

struct Data {
  std::vector<uint8_t> w;
  std::vector<uint8_t> sf_e4m3;  // NVFP4 block scales
  std::vector<float> sf_f32;     // per-channel / block scales
  float global_scale = 1.0f;
  std::vector<float> dense;  // [n, k] dequantized reference
};

// Random positive finite e4m3 code (not 0x7F, the NaN).
uint8_t random_scale_code(std::mt19937& rng) {
  return uint8_t(std::uniform_int_distribution<int>(0x20, 0x7E)(rng));
}

Data make_data(const Case& c, std::mt19937& rng) {
  Data d;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  d.dense.resize(size_t(c.n) * c.k);
  switch (c.format) {
    case WeightFormat::kNvfp4: {
      d.w.resize(size_t(c.n) * c.k / 2);
      for (auto& b : d.w) b = uint8_t(byte(rng));
      d.sf_e4m3.resize(size_t(c.n) * c.k / 16);
      for (auto& s : d.sf_e4m3) s = random_scale_code(rng);
      d.global_scale = scale(rng);
      for (int r = 0; r < c.n; ++r)
        for (int i = 0; i < c.k; ++i) {
          uint8_t byte_v = d.w[size_t(r) * c.k / 2 + i / 2];
          uint8_t code = i % 2 == 0 ? byte_v & 0xf : byte_v >> 4;  // element 2i: low nibble
          float sf = e4m3_to_float(d.sf_e4m3[size_t(r) * c.k / 16 + i / 16]);
          d.dense[size_t(r) * c.k + i] = (e2m1_value(code) * sf) * d.global_scale;
        }
      break;
    }
    case WeightFormat::kFp8PerTensor:
    case WeightFormat::kFp8PerChannel:
    case WeightFormat::kFp8Block: {
      d.w.resize(size_t(c.n) * c.k);
      for (auto& b : d.w) {
        b = uint8_t(byte(rng));
        if ((b & 0x7f) == 0x7f) b = 0x11;  // no NaN codes
      }
      const int bn = (c.n + c.block_n - 1) / c.block_n, bk = (c.k + c.block_k - 1) / c.block_k;
      if (c.format == WeightFormat::kFp8PerTensor) d.global_scale = scale(rng);
      if (c.format == WeightFormat::kFp8PerChannel) d.sf_f32.resize(c.n);
      if (c.format == WeightFormat::kFp8Block) d.sf_f32.resize(size_t(bn) * bk);
      for (auto& s : d.sf_f32) s = scale(rng);
      for (int r = 0; r < c.n; ++r)
        for (int i = 0; i < c.k; ++i) {
          float s = c.format == WeightFormat::kFp8PerTensor ? d.global_scale
                    : c.format == WeightFormat::kFp8PerChannel
                        ? d.sf_f32[r]
                        : d.sf_f32[size_t(r / c.block_n) * bk + i / c.block_k];
          d.dense[size_t(r) * c.k + i] = e4m3_to_float(d.w[size_t(r) * c.k + i]) * s;
        }
      break;
    }
  }
  return d;
}

kernels::QuantLinearParams params(const Case& c, const Data& d) {
  kernels::QuantLinearParams p{};
  p.format = c.format;
  p.w = d.w.data();
  p.scales = c.format == WeightFormat::kNvfp4 ? static_cast<const void*>(d.sf_e4m3.data())
             : d.sf_f32.empty()               ? nullptr
                                              : static_cast<const void*>(d.sf_f32.data());
  p.global_scale = d.global_scale;
  p.block_n = c.block_n;
  p.block_k = c.block_k;
  p.n = c.n;
  p.k = c.k;
  return p;
}

class QuantLinear : public ::testing::TestWithParam<Case> {};

TEST_P(QuantLinear, EqualsDenseLinearOnDequantizedWeightsBitExact) {
  const Case c = GetParam();
  std::mt19937 rng(1234 + c.n * 7 + c.k + int(c.format));
  Data d = make_data(c, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> bias(c.n);
  for (float& b : bias) b = normal(rng);
  for (int m : {1, 3, 17}) {
    for (bool with_bias : {false, true}) {
      std::vector<float> x(size_t(m) * c.k), got(size_t(m) * c.n, NAN), want(size_t(m) * c.n);
      for (float& v : x) v = normal(rng);
      kernels::QuantLinearParams p = params(c, d);
      p.x = x.data();
      p.y = got.data();
      p.m = m;
      p.bias = with_bias ? bias.data() : nullptr;
      p.bias_dtype = DType::kF32;
      kernels::cpu::quant_linear(p);
      kernels::cpu::linear({x.data(), d.dense.data(), DType::kF32,
                            with_bias ? bias.data() : nullptr, want.data(), m, c.n, c.k});
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << "m " << m << " bias " << with_bias << " index " << i;
    }
  }
  // dequant_weight_row gives the reference rows exactly.
  std::vector<float> row(c.k);
  for (int r = 0; r < c.n; r += std::max(1, c.n / 5)) {
    kernels::cpu::dequant_weight_row(params(c, d), r, row.data());
    for (int i = 0; i < c.k; ++i) ASSERT_EQ(row[i], d.dense[size_t(r) * c.k + i]) << r << "," << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuantLinear,
    ::testing::Values(Case{WeightFormat::kNvfp4, 5, 16}, Case{WeightFormat::kNvfp4, 33, 48},
                      Case{WeightFormat::kNvfp4, 64, 272}, Case{WeightFormat::kFp8PerTensor, 7, 40},
                      Case{WeightFormat::kFp8PerTensor, 33, 48},
                      Case{WeightFormat::kFp8PerChannel, 9, 24},
                      Case{WeightFormat::kFp8PerChannel, 65, 96},
                      Case{WeightFormat::kFp8Block, 256, 384},  // whole 128x128 blocks
                      Case{WeightFormat::kFp8Block, 130, 200},  // ragged last row / column block
                      Case{WeightFormat::kFp8Block, 40, 56, 16, 24}));

TEST(QuantLinear, Nvfp4RejectsKNotMultipleOf16) {
  std::vector<uint8_t> w(8), sf(1);
  std::vector<float> x(24), y(1);
  kernels::QuantLinearParams p{};
  p.format = WeightFormat::kNvfp4;
  p.x = x.data();
  p.w = w.data();
  p.scales = sf.data();
  p.y = y.data();
  p.m = 1, p.n = 1, p.k = 24;
  EXPECT_THROW(kernels::cpu::quant_linear(p), InvalidArgument);
}

// The NVFP4 weight of `d` as the loader hands it to a backend (host tensors).
backend::QuantizedWeight nvfp4_weight(const Case& c, const Data& d) {
  backend::QuantizedWeight q;
  q.format = c.format;
  q.n = c.n;
  q.k = c.k;
  q.data = host_empty(DType::kU8, {c.n, c.k / 2});
  std::memcpy(q.data.data, d.w.data(), d.w.size());
  q.scales = host_empty(DType::kF8E4M3, {c.n, c.k / 16});
  std::memcpy(q.scales.data, d.sf_e4m3.data(), d.sf_e4m3.size());
  q.global_scale = {d.global_scale};
  return q;
}

// Through the CPU backend: a Weight holding a quantized linear, with a bf16 bias.
TEST(QuantLinear, CpuBackendRunsQuantizedWeight) {
  const Case c{WeightFormat::kNvfp4, 24, 32};
  std::mt19937 rng(7);
  Data d = make_data(c, rng);
  auto b = backend::make_cpu_backend();
  backend::QuantizedWeight q = nvfp4_weight(c, d);
  q.input_scale = {1.0f};
  backend::Weight w{Tensor{}, b->upload_quantized(q)};
  Tensor bias = host_empty(DType::kBF16, {c.n});
  for (int i = 0; i < c.n; ++i) bias.as<bf16>()[i] = float_to_bf16(0.25f * float(i % 5) - 0.5f);
  Tensor x = host_empty(DType::kF32, {3, c.k});
  for (int i = 0; i < 3 * c.k; ++i) x.as<float>()[i] = std::sin(0.37f * float(i));
  Tensor y = b->empty(DType::kF32, {3, c.n});
  b->linear(x, w, &bias, y);
  for (int m = 0; m < 3; ++m)
    for (int n = 0; n < c.n; ++n) {
      double want = bf16_to_float(bias.as<bf16>()[n]);
      for (int i = 0; i < c.k; ++i)
        want += double(x.as<float>()[m * c.k + i]) * d.dense[size_t(n) * c.k + i];
      EXPECT_NEAR(y.as<float>()[m * c.n + n], want, 1e-5 * (1 + std::fabs(want)));
    }
}

// W4A4 (--nvfp4-activations): the CPU backend quantizes each input row by SPEC 2.2 with
// g = 1/input_scale (bf16 input, e4m3 block scales, e2m1 codes) and multiplies the dequantized
// values with the dequantized weights; computed here from the decoded codes of the reference
// quantizer (kernels::cpu::nvfp4_quant, tested bit-exact on its own).
TEST(QuantLinear, CpuBackendW4A4QuantizesInputRows) {
  const Case c{WeightFormat::kNvfp4, 24, 64};
  std::mt19937 rng(11);
  Data d = make_data(c, rng);
  auto b = backend::make_cpu_backend();
  backend::QuantizedWeight q = nvfp4_weight(c, d);
  const float input_scale = 3.0f / (448.0f * 6.0f);  // calibrated for |x| up to 3
  q.input_scale = {input_scale};
  q.quantize_activations = true;
  backend::Weight w{Tensor{}, b->upload_quantized(q)};
  const int m = 4;
  Tensor x = host_empty(DType::kF32, {m, c.k});
  for (int i = 0; i < m * c.k; ++i) x.as<float>()[i] = 2.5f * std::sin(0.61f * float(i));
  Tensor y = b->empty(DType::kF32, {m, c.n});
  b->linear(x, w, nullptr, y);

  const float g = 1.0f / input_scale;
  std::vector<bf16> xb(size_t(m) * c.k);
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = float_to_bf16(x.as<float>()[i]);
  std::vector<uint8_t> codes(xb.size() / 2), sf(xb.size() / 16);
  kernels::cpu::nvfp4_quant({xb.data(), DType::kBF16, g, codes.data(), sf.data(),
                             kernels::Nvfp4SfLayout::kLinear, m, c.k});
  double max_change = 0;
  for (int r = 0; r < m; ++r)
    for (int n = 0; n < c.n; ++n) {
      double want = 0, unquantized = 0;
      for (int i = 0; i < c.k; ++i) {
        const size_t e = size_t(r) * c.k + i;
        const uint8_t code = uint8_t((codes[e / 2] >> (4 * (i & 1))) & 0xF);
        const float xq = e2m1_value(code) * e4m3_to_float(sf[e / 16]) / g;
        want += double(xq) * d.dense[size_t(n) * c.k + i];
        unquantized += double(x.as<float>()[e]) * d.dense[size_t(n) * c.k + i];
      }
      EXPECT_NEAR(y.as<float>()[r * c.n + n], want, 1e-5 * (1 + std::fabs(want)));
      max_change = std::max(max_change, std::fabs(want - unquantized));
    }
  EXPECT_GT(max_change, 1e-3) << "the activation quantization must change the result";
}

TEST(QuantLinear, Nvfp4ActivationsNeedAnNvfp4CheckpointWithInputScales) {
  quant::QuantConfig nvfp4;
  nvfp4.method = quant::QuantConfig::Method::kNvfp4;
  nvfp4.group_size = 16;
  nvfp4.static_activations = true;
  auto ok = model::make_dummy_weights(DType::kBF16, 1, nvfp4);
  ok->enable_nvfp4_activations();
  EXPECT_TRUE(ok->quant_config().nvfp4_activations);

  quant::QuantConfig no_scales = nvfp4;
  no_scales.static_activations = false;
  try {
    model::make_dummy_weights(DType::kBF16, 1, no_scales)->enable_nvfp4_activations();
    ADD_FAILURE() << "no input scales accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("without input scales"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model::make_dummy_weights(DType::kBF16, 1, {})->enable_nvfp4_activations(),
               InvalidArgument);
}

}  // namespace
}  // namespace serval
