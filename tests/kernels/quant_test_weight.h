// Quantized test weights shared by the quantized GEMM / GEMV tests: random checkpoint-layout
// weights (FP4 codes / FP8 bytes without NaN codes, realistic e4m3 block scales, random fp32
// scales), their CPU-oracle parameters, their device copy in the GEMM layout, the backend's host
// QuantizedWeight, and row permutations into the tiled orders of quant_gemm.h.
#pragma once
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "kernels/cpu/quant_linear.h"
#include "kernels/cuda/gemm/quant_gemm.h"
#include "kernels/cuda_test_util.h"
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

// A backend's host QuantizedWeight (checkpoint layout) holding tw.
inline backend::QuantizedWeight host_weight(const TestWeight& tw) {
  const int n = tw.n, k = tw.k;
  backend::QuantizedWeight host;
  host.format = tw.format;
  host.n = n;
  host.k = k;
  host.global_scale = {tw.global_scale};
  host.input_scale = {1.0f};
  if (tw.format == WeightFormat::kNvfp4) {
    host.data = host_empty(DType::kU8, {n, k / 2});
    host.scales = host_empty(DType::kF8E4M3, {n, k / 16});
    std::memcpy(host.scales.data, tw.nvfp4_sf.data(), tw.nvfp4_sf.size());
  } else {
    host.data = host_empty(DType::kF8E4M3, {n, k});
    if (!tw.fp32_scales.empty()) {
      host.scales = host_empty(DType::kF32, {n});
      std::memcpy(host.scales.data, tw.fp32_scales.data(), tw.fp32_scales.size() * 4);
    }
  }
  std::memcpy(host.data.data, tw.data.data(), tw.data.size());
  return host;
}

// x [m, k] as the CPU backend's f32 tensor and the GPU backend's bf16 one.
struct BackendInput {
  Tensor cpu, gpu;
};
inline BackendInput backend_input(backend::Backend& gpu, int m, int k, uint32_t seed) {
  const std::vector<bf16> xb = random_bf16(size_t(m) * k, seed);
  BackendInput in{host_empty(DType::kF32, {m, k}), {}};
  const std::vector<float> xf = to_float(xb);
  std::memcpy(in.cpu.data, xf.data(), xf.size() * 4);
  Tensor xh = host_empty(DType::kBF16, {m, k});
  std::memcpy(xh.data, xb.data(), xb.size() * 2);
  in.gpu = gpu.upload(xh);
  return in;
}

// tw with its rows in the order source_row(r) gives (device row r holds checkpoint row
// source_row(r)): codes, NVFP4 block scales, FP8 channel scales.
template <typename SourceRow>
TestWeight permuted_rows(const TestWeight& tw, SourceRow source_row) {
  TestWeight out = tw;
  const size_t code_row = tw.data.size() / size_t(tw.n);
  for (int r = 0; r < tw.n; ++r) {
    const int src = source_row(r);
    std::memcpy(out.data.data() + size_t(r) * code_row, tw.data.data() + size_t(src) * code_row,
                code_row);
    if (!tw.nvfp4_sf.empty()) {
      const size_t sf_row = size_t(tw.k / 16);
      std::memcpy(out.nvfp4_sf.data() + size_t(r) * sf_row,
                  tw.nvfp4_sf.data() + size_t(src) * sf_row, sf_row);
    }
    if (tw.format == WeightFormat::kFp8PerChannel)
      out.fp32_scales[size_t(r)] = tw.fp32_scales[size_t(src)];
  }
  return out;
}

// The rows of tw in the gate/up tiled order.
inline TestWeight tiled_rows(const TestWeight& tw) {
  return permuted_rows(tw, [&](int r) { return kc::quant_gemm_gate_up_source_row(r, tw.n / 2); });
}

// The rows of a q/k/v weight tw in the rotary-pair tiled order of its first rope_heads heads.
inline TestWeight rope_tiled_rows(const TestWeight& tw, int rope_heads, int head_dim) {
  return permuted_rows(tw, [&](int r) {
    return kc::quant_gemm_rope_source_row(r, head_dim, rope_heads * head_dim);
  });
}

}  // namespace serval::testing
