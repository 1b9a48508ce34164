// Shared by the quantized GEMM / GEMV tests: random weights in each format with their CPU-oracle
// parameters and device copies in the GEMM layout, oracle cases, and a runner of the GEMM entry
// points into poisoned outputs.
#pragma once
#include "kernels/cuda/gemm/quant_gemm.h"
#include "kernels/cuda/gemm/quant_gemv.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/quantized_pack.h"
#include "kernels/cpu/quant_linear.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "tensor/tensor.h"

namespace serval::testing {

using kernels::WeightFormat;
namespace kc = kernels::cuda;

constexpr int kBlock = 128;  // FP8 block tile (DeepSeek style)

// A weight in checkpoint layout plus its device copy in the GEMM layout.
struct TestWeight {
  WeightFormat format;
  int n, k;
  std::vector<uint8_t> data;       // NVFP4 [n, k/2]; FP8 [n, k]
  std::vector<uint8_t> nvfp4_sf;   // [n, k/16]
  std::vector<float> fp32_scales;  // per-channel [n]; block [ceil(n/128), ceil(k/128)]
  float global_scale = 1.0f;
};

inline uint8_t random_e4m3_scale(std::mt19937& rng) {
  const int kind = int(rng() % 20);
  if (kind == 0) return 0;                               // zero scale (all-zero block)
  if (kind == 1) return uint8_t(1 + rng() % 7);          // subnormal
  return uint8_t(((3 + rng() % 8) << 3) | (rng() % 8));  // exponent 3..10
}

inline TestWeight make_weight(WeightFormat format, int n, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  TestWeight w{format, n, k, {}, {}, {}, 1.0f};
  std::uniform_real_distribution<float> scale(2e-4f, 2e-3f);
  if (format == WeightFormat::kNvfp4) {
    w.data.resize(size_t(n) * k / 2);
    for (auto& b : w.data) b = uint8_t(rng());
    w.nvfp4_sf.resize(size_t(n) * k / 16);
    for (auto& b : w.nvfp4_sf) b = random_e4m3_scale(rng);
    w.global_scale = 3.1e-4f;
    return w;
  }
  w.data.resize(size_t(n) * k);
  for (auto& b : w.data) {
    b = uint8_t(rng());
    if ((b & 0x7F) == 0x7F) b = uint8_t(b & 0xFE);  // no NaN codes
  }
  if (format == WeightFormat::kFp8PerTensor) w.global_scale = 7.3e-4f;
  if (format == WeightFormat::kFp8PerChannel) w.fp32_scales.resize(n);
  if (format == WeightFormat::kFp8Block)
    w.fp32_scales.resize(size_t((n + kBlock - 1) / kBlock) * ((k + kBlock - 1) / kBlock));
  for (auto& s : w.fp32_scales) s = scale(rng);
  return w;
}

inline kernels::QuantLinearParams cpu_params(const TestWeight& w) {
  kernels::QuantLinearParams p{};
  p.format = w.format;
  p.w = w.data.data();
  p.scales = w.format == WeightFormat::kNvfp4 ? static_cast<const void*>(w.nvfp4_sf.data())
                                              : static_cast<const void*>(w.fp32_scales.data());
  p.global_scale = w.global_scale;
  p.block_n = p.block_k = kBlock;
  p.bias_dtype = DType::kF32;
  p.n = w.n;
  p.k = w.k;
  return p;
}

// The weight packed and uploaded in the GEMM layout.
struct DeviceWeight {
  DeviceBuffer<uint8_t> data;
  DeviceBuffer<uint8_t> scale_bytes;
  kc::QuantGemmWeight w{};

  static std::vector<uint8_t> scales_of(const TestWeight& t) {
    switch (t.format) {
      case WeightFormat::kNvfp4:
        return kc::quant_gemm_pack_nvfp4_scales(t.nvfp4_sf.data(), t.n, t.k);
      case WeightFormat::kFp8PerChannel: {
        std::vector<uint8_t> b(t.fp32_scales.size() * 4);
        std::memcpy(b.data(), t.fp32_scales.data(), b.size());
        return b;
      }
      case WeightFormat::kFp8Block: {
        const std::vector<bf16> s =
            kc::quant_gemm_pack_block_scales(t.fp32_scales.data(), t.fp32_scales.size());
        std::vector<uint8_t> b(s.size() * 2);
        std::memcpy(b.data(), s.data(), b.size());
        return b;
      }
      case WeightFormat::kFp8PerTensor:
        break;
    }
    return {0};
  }

  explicit DeviceWeight(const TestWeight& t)
      : data(kc::quant_gemm_pack_data(t.format, t.data.data(), t.n, t.k)),
        scale_bytes(scales_of(t)) {
    w.format = t.format;
    w.n = t.n;
    w.k = t.k;
    w.data = data.get();
    w.scales = t.format == WeightFormat::kFp8PerTensor ? nullptr : scale_bytes.get();
    w.global_scale = t.global_scale;
    w.block_n = w.block_k = kBlock;
  }
};

inline const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kNvfp4:
      return "nvfp4";
    case WeightFormat::kFp8PerTensor:
      return "fp8-tensor";
    case WeightFormat::kFp8PerChannel:
      return "fp8-channel";
    case WeightFormat::kFp8Block:
      return "fp8-block";
  }
  return "?";
}

constexpr WeightFormat kFormats[] = {WeightFormat::kNvfp4, WeightFormat::kFp8PerTensor,
                                     WeightFormat::kFp8PerChannel, WeightFormat::kFp8Block};

struct Shape2 {
  int n, k, max_m;  // max_m bounds the CPU oracle's cost
};

// A weight of `s` with its CPU-oracle outputs: random x [max_m, k] and bias [n] (seeds taken
// from `seed` in that order: weight, x, bias), want = the oracle on x without the bias (rows are
// independent: smaller m use the leading rows).
struct OracleCase {
  TestWeight tw;
  std::vector<bf16> xb, bias_b;
  std::vector<float> bias_f, want;
};

inline OracleCase make_oracle_case(WeightFormat format, const Shape2& s, uint32_t& seed) {
  OracleCase o;
  o.tw = make_weight(format, s.n, s.k, seed++);
  o.xb = random_bf16(size_t(s.max_m) * s.k, seed++);
  const std::vector<float> xf = to_float(o.xb);
  o.want.resize(size_t(s.max_m) * s.n);
  kernels::QuantLinearParams cp = cpu_params(o.tw);
  cp.x = xf.data();
  cp.y = o.want.data();
  cp.m = s.max_m;
  kernels::cpu::quant_linear(cp);
  o.bias_b = random_bf16(s.n, seed++, -0.5f, 0.5f);
  o.bias_f = to_float(o.bias_b);
  return o;
}

// Runs one of the GEMM entry points on device inputs into a fresh poisoned output of m + 1 rows
// (plus one element): the row past m and the guard element must stay 0xFF (tokens ≥ m never
// written). Returns the first m·n outputs as float.
enum class Path { kDispatch, kGemv, kMma };

inline std::vector<float> run_path(Path path, const kc::QuantGemmWeight& w, const bf16* x,
                                   const bf16* bias, int m, bool f32) {
  const size_t out = size_t(m) * w.n, total = out + w.n + 1;
  DeviceBuffer<uint8_t> y(total * (f32 ? 4 : 2));
  y.poison();
  DeviceBuffer<uint8_t> ws(std::max<size_t>(kc::quant_gemm_workspace_bytes(m, w.n, w.k), 1));
  kc::QuantGemmParams p{};
  p.x = x;
  p.w = w;
  p.bias = bias;
  p.y = y.get();
  p.y_f32 = f32;
  p.m = m;
  p.workspace = ws.get();
  p.workspace_bytes = ws.size();
  switch (path) {
    case Path::kDispatch:
      kc::quant_gemm(p, nullptr);
      break;
    case Path::kGemv:
      kc::quant_gemv(p, nullptr);
      break;
    case Path::kMma:
      kc::quant_gemm_mma(p, nullptr);
      break;
  }
  const std::vector<uint8_t> bytes = y.download();
  const size_t esize = f32 ? 4 : 2;
  size_t written_past = 0;
  for (size_t i = out * esize; i < bytes.size(); ++i) written_past += bytes[i] != 0xFF;
  EXPECT_EQ(written_past, 0u) << "bytes written past token m - 1 (m = " << m << ")";
  std::vector<float> v(out);
  for (size_t i = 0; i < out; ++i) {
    if (f32) {
      std::memcpy(&v[i], bytes.data() + 4 * i, 4);
    } else {
      bf16 b;
      std::memcpy(&b.bits, bytes.data() + 2 * i, 2);
      v[i] = bf16_to_float(b);
    }
  }
  return v;
}

}  // namespace serval::testing
