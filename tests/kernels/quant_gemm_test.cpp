// CUDA weight-only quantized GEMMs (NVFP4, FP8 per-tensor / per-channel / block) against the CPU
// oracle kernels::cpu::quant_linear on the same bf16-rounded activations. Weights: random FP4
// codes / FP8 bytes (NaN codes excluded), realistic e4m3 block scales (mostly exponents 3..10,
// some subnormal and zero scales), random fp32 scales. Outputs are poisoned (0xFF → NaN) before
// every call, so an unwritten element fails. Tolerances (rel L2 over the whole output):
//   bf16 output: 1e-2 (bf16 rounding of each output is ≤ 2^-9 relative);
//   f32 output: 1e-4 for NVFP4 / FP8 per-tensor / per-channel (the dequantized products are exact
//   in bf16; only the fp32 summation order differs), 1e-2 for FP8 block (the kernel rounds the
//   fp32 block scales to bf16).
// The dequantize-to-bf16 kernel is checked bit for bit (block FP8: 1e-2). QuantGemmBench.DISABLED_*
// times the GEMM and the dequantize kernel (--gtest_also_run_disabled_tests
// --gtest_filter='QuantGemmBench.*').
#include "kernels/cuda/gemm/quant_gemm.h"
#include "kernels/cuda/gemm/quant_gemv.h"
#include "kernels/cuda/norm_rope/rms_norm.h"
#include "kernels/nvfp4_word.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/quantized_pack.h"
#include "kernels/cpu/quant_linear.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gemm_bench_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/nvfp4_word.h"
#include "quant_gemm_test_support.h"
#include "tensor/tensor.h"

namespace serval::testing {
namespace {

// The load-time repacking (host code: runs without a GPU) against the fragment layout of
// quant_gemm.h, evaluated here one element at a time: lane bytes at
// (((rt·k_blocks + kb)·2 + h)·32 + lane)·B; register a_i holds rows g + 8(i & 1), columns
// 16t + 4s + 2(i >> 1) (+1) of k16 step s; NVFP4 codes in word s as kernels/nvfp4_word.h places
// them (lo = even column, hi = odd), FP8 bytes 1/3
// (even i) or 0/2 (odd i) of word 2s + i/2; padding is code 0.
TEST(QuantGemmPack, MatchesTheFragmentLayout) {
  std::mt19937 rng(5);
  for (WeightFormat format : {WeightFormat::kNvfp4, WeightFormat::kFp8PerTensor}) {
    const bool fp4 = format == WeightFormat::kNvfp4;
    for (auto [n, k] : {std::pair{32, 64}, {33, 80}, {300, 208}, {1, 16}, {77, 1024}}) {
      std::vector<uint8_t> src(size_t(n) * (fp4 ? k / 2 : k));
      for (uint8_t& b : src) b = uint8_t(rng());
      const std::vector<uint8_t> got = kc::quant_gemm_pack_data(format, src.data(), n, k);
      const int k_blocks = kc::quant_gemm_k_pad(k) / 64, lane_bytes = fp4 ? 16 : 32;
      ASSERT_EQ(got.size(), kc::quant_gemm_data_bytes(format, n, k));
      std::vector<uint8_t> want(got.size(), 0);
      for (int rt = 0; rt < kc::quant_gemm_n_pad(n) / 32; ++rt)
        for (int kb = 0; kb < k_blocks; ++kb)
          for (int h = 0; h < 2; ++h)
            for (int lane = 0; lane < 32; ++lane) {
              uint8_t* dst = want.data() + ((size_t(rt * k_blocks + kb) * 2 + h) * 32 + lane) *
                                               size_t(lane_bytes);
              const int g = lane / 4, t = lane % 4;
              for (int s = 0; s < 4; ++s)
                for (int i = 0; i < 4; ++i)
                  for (int half = 0; half < 2; ++half) {
                    const int row = rt * 32 + h * 16 + g + 8 * (i & 1);
                    const int col = kb * 64 + 16 * t + 4 * s + 2 * (i >> 1) + half;
                    if (row >= n || col >= k) continue;
                    if (fp4) {
                      const uint8_t byte = src[size_t(row) * (k / 2) + col / 2];
                      const uint8_t code = (col & 1) ? byte >> 4 : byte & 0xF;
                      uint32_t w;
                      std::memcpy(&w, dst + 4 * s, 4);
                      w |= kernels::nvfp4_word_bits(code, i, half);
                      std::memcpy(dst + 4 * s, &w, 4);
                    } else {
                      const int byte = (i & 1) ? (half ? 2 : 0) : (half ? 3 : 1);
                      dst[4 * (2 * s + (i >> 1)) + byte] = src[size_t(row) * k + col];
                    }
                  }
            }
      EXPECT_EQ(got, want) << (fp4 ? "nvfp4" : "fp8") << " n " << n << " k " << k;
    }
  }
}

// The bit placement of kernels/nvfp4_word.h, checked against the E2M1 -> bf16 rule it must
// implement (independent of the packer): the 4 × 2 code slots tile the 32 bits of a word, and
// register i's decode gives, per half, sign at bit 15 and e1 e0 m at bits 8..6 of its own code
// whatever the other seven codes are.
TEST(QuantGemmPack, Nvfp4WordDecodesEveryCode) {
  uint32_t all = 0;
  int bits = 0;
  for (int i = 0; i < 4; ++i)
    for (int half = 0; half < 2; ++half) {
      const uint32_t slot = kernels::nvfp4_word_bits(0xF, i, half);
      EXPECT_EQ(all & slot, 0u) << "slot " << i << "/" << half << " overlaps another";
      all |= slot;
      bits += std::popcount(slot);
    }
  EXPECT_EQ(all, 0xFFFFFFFFu);
  EXPECT_EQ(bits, 32);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 4096; ++trial) {
    uint32_t codes[4][2], w = 0;
    for (int i = 0; i < 4; ++i)
      for (int half = 0; half < 2; ++half) {
        codes[i][half] = rng() & 0xF;
        w |= kernels::nvfp4_word_bits(codes[i][half], i, half);
      }
    for (int i = 0; i < 4; ++i) {
      uint32_t want = 0;
      for (int half = 0; half < 2; ++half) {
        const uint32_t c = codes[i][half];
        want |= ((c >> 3) << 15 | (c & 7u) << 6) << (16 * half);
      }
      ASSERT_EQ(kernels::nvfp4_bf16x2_bits(w, i), want) << "register " << i << " word " << w;
    }
  }
}

// NVFP4 scales in their 128-byte tiles (quant_gemm.h), from the reader's side: lane g's 16 bytes
// at (rt·k_blocks + kb)·128 + 16g hold, word w and byte s, the scale of row rt·32 + g + 8w and
// 16-column group 4kb + s (0 in the padding).
TEST(QuantGemmPack, Nvfp4ScalesInTiles) {
  std::mt19937 rng(6);
  for (auto [n, k] : {std::pair{32, 64}, {33, 80}, {300, 208}, {1, 16}, {77, 1024}}) {
    const int cols = k / 16, k_blocks = kc::quant_gemm_k_pad(k) / 64;
    std::vector<uint8_t> src(size_t(n) * cols);
    for (uint8_t& b : src) b = uint8_t(1 + rng() % 255);
    const std::vector<uint8_t> got = kc::quant_gemm_pack_nvfp4_scales(src.data(), n, k);
    std::vector<uint8_t> want(size_t(kc::quant_gemm_n_pad(n)) * k_blocks * 4, 0);
    for (int rt = 0; rt < kc::quant_gemm_n_pad(n) / 32; ++rt)
      for (int kb = 0; kb < k_blocks; ++kb)
        for (int g = 0; g < 8; ++g)
          for (int w = 0; w < 4; ++w)
            for (int s = 0; s < 4; ++s) {
              const int row = rt * 32 + g + 8 * w, col = 4 * kb + s;
              if (row < n && col < cols)
                want[(size_t(rt) * k_blocks + kb) * 128 + 16 * g + 4 * w + s] =
                    src[size_t(row) * cols + col];
            }
    EXPECT_EQ(got, want) << "n " << n << " k " << k;
  }
}

TEST(QuantGemm, MatchesCpuOracle) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const Shape2 shapes[] = {{256, 128, 256},  {200, 80, 256},    {300, 208, 64},
                           {6144, 2048, 64}, {2048, 4096, 256}, {4096, 5120, 33}};
  const int ms[] = {1, 2, 3, 7, 8, 9, 16, 17, 33, 64, 256};
  uint32_t seed = 1;
  int variant = 0;
  for (WeightFormat format : kFormats) {
    for (const Shape2& s : shapes) {
      const OracleCase o = make_oracle_case(format, s, seed);
      const std::vector<float>& want = o.want;
      const std::vector<float>& bias_f = o.bias_f;
      DeviceWeight dw(o.tw);
      DeviceBuffer<bf16> x(o.xb), bias(o.bias_b);
      for (int m : ms) {
        if (m > s.max_m) continue;
        const bool with_bias = variant % 2 == 0, f32 = variant % 3 == 0;
        ++variant;
        std::vector<float> ref(want.begin(), want.begin() + size_t(m) * s.n);
        if (with_bias)
          for (int r = 0; r < m; ++r)
            for (int c = 0; c < s.n; ++c) ref[size_t(r) * s.n + c] += bias_f[c];
        DeviceBuffer<uint8_t> ws(std::max<size_t>(kc::quant_gemm_workspace_bytes(m, s.n, s.k), 1));
        DeviceBuffer<float> yf(size_t(m) * s.n);
        DeviceBuffer<bf16> yb(size_t(m) * s.n);
        yf.poison();
        yb.poison();
        kc::QuantGemmParams p{};
        p.x = x.get();
        p.w = dw.w;
        p.bias = with_bias ? bias.get() : nullptr;
        p.y = f32 ? static_cast<void*>(yf.get()) : static_cast<void*>(yb.get());
        p.y_f32 = f32;
        p.m = m;
        p.workspace = ws.get();
        p.workspace_bytes = ws.size();
        kc::quant_gemm(p, nullptr);
        const double err = f32 ? rel_l2(yf.download(), ref) : rel_l2(yb.download(), ref);
        const double tol = (!f32 || format == WeightFormat::kFp8Block) ? 1e-2 : 1e-4;
        EXPECT_LT(err, tol) << format_name(format) << " m=" << m << " n=" << s.n << " k=" << s.k
                            << (with_bias ? " bias" : "") << (f32 ? " f32" : " bf16");
      }
    }
  }
}

// The gate/up tiling is a permutation of the 2·inter rows that puts gate row j and up row j in
// one 32-row tile, 16 rows apart (host-only).
TEST(QuantGemmPack, GateUpTilingPairsGateAndUpRows) {
  for (int inter : {16, 48, 1024}) {
    std::vector<int> seen(size_t(2 * inter), 0);
    for (int r = 0; r < 2 * inter; ++r) {
      const int src = kc::quant_gemm_gate_up_source_row(r, inter);
      ASSERT_GE(src, 0);
      ASSERT_LT(src, 2 * inter);
      ++seen[size_t(src)];
      if (r % 32 < 16) {
        EXPECT_EQ(src, 16 * (r / 32) + r % 32) << "gate row of device row " << r;
        EXPECT_EQ(kc::quant_gemm_gate_up_source_row(r + 16, inter), inter + src) << "its up row";
      }
    }
    for (int c : seen) EXPECT_EQ(c, 1) << "inter " << inter << ": not a permutation";
  }
}

TEST(QuantGemm, DequantMatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const Shape2 shapes[] = {{200, 80, 0}, {300, 208, 0}, {2048, 4096, 0}};
  uint32_t seed = 100;
  for (WeightFormat format : kFormats) {
    for (const Shape2& s : shapes) {
      const TestWeight tw = make_weight(format, s.n, s.k, seed++);
      DeviceWeight dw(tw);
      DeviceBuffer<bf16> out(size_t(s.n) * s.k);
      out.poison();
      kc::quant_dequant_bf16(dw.w, out.get(), nullptr);
      const std::vector<bf16> got = out.download();
      std::vector<float> want(size_t(s.n) * s.k);
      const kernels::QuantLinearParams cp = cpu_params(tw);
      for (int r = 0; r < s.n; ++r) kernels::cpu::dequant_weight_row(cp, r, &want[size_t(r) * s.k]);
      if (format == WeightFormat::kFp8Block) {
        EXPECT_LT(rel_l2(got, want), 1e-2) << format_name(format) << " n=" << s.n;
        continue;
      }
      size_t mismatches = 0;
      for (size_t i = 0; i < want.size(); ++i)
        if (got[i].bits != float_to_bf16(want[i]).bits && mismatches++ < 5)
          ADD_FAILURE() << format_name(format) << " n=" << s.n << " k=" << s.k << " element " << i
                        << ": got " << bf16_to_float(got[i]) << ", want " << want[i];
      EXPECT_EQ(mismatches, 0u) << format_name(format);
    }
  }
}

// A backend's host QuantizedWeight (checkpoint layout) holding tw.
backend::QuantizedWeight host_weight(const TestWeight& tw) {
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
BackendInput backend_input(backend::Backend& gpu, int m, int k, uint32_t seed) {
  const std::vector<bf16> xb = random_bf16(size_t(m) * k, seed);
  BackendInput in{host_empty(DType::kF32, {m, k}), {}};
  const std::vector<float> xf = to_float(xb);
  std::memcpy(in.cpu.data, xf.data(), xf.size() * 4);
  Tensor xh = host_empty(DType::kBF16, {m, k});
  std::memcpy(xh.data, xb.data(), xb.size() * 2);
  in.gpu = gpu.upload(xh);
  return in;
}

// The CUDA backend (upload_quantized + quantized_linear, both the fused kernel and the
// dequantize + cuBLASLt path for m > kQuantGemmMaxM) against the CPU backend.
TEST(QuantGemm, BackendMatchesCpuBackend) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto gpu = backend::make_cuda_backend();
  if (!gpu) GTEST_SKIP() << "CUDA backend unavailable: skipped";
  auto cpu = backend::make_cpu_backend();
  uint32_t seed = 200;
  for (WeightFormat format : {WeightFormat::kNvfp4, WeightFormat::kFp8PerChannel}) {
    const int n = 320, k = 512;
    const TestWeight tw = make_weight(format, n, k, seed++);
    const backend::QuantizedWeight host = host_weight(tw);
    const backend::QuantizedWeight wc = cpu->upload_quantized(host);
    const backend::QuantizedWeight wg = gpu->upload_quantized(host);
    for (int m : {3, 100}) {
      const BackendInput x = backend_input(*gpu, m, k, seed++);
      const std::vector<bf16> bb = random_bf16(n, seed++, -0.5f, 0.5f);
      Tensor bias_host = host_empty(DType::kBF16, {n});
      std::memcpy(bias_host.data, bb.data(), bb.size() * 2);
      Tensor yc = host_empty(DType::kF32, {m, n});
      cpu->quantized_linear(x.cpu, wc, &bias_host, yc);
      const std::vector<float> want(yc.as<float>(), yc.as<float>() + size_t(m) * n);

      const Tensor& xg = x.gpu;
      const Tensor bg = gpu->upload(bias_host);
      Tensor yg = gpu->empty(DType::kBF16, {m, n});
      // The backend's stream does not synchronize with the legacy stream: fence both sides.
      cuda_check(cudaDeviceSynchronize(), "sync");
      cuda_check(cudaMemset(yg.data, 0xFF, yg.nbytes()), "poison");
      cuda_check(cudaDeviceSynchronize(), "sync");
      gpu->quantized_linear(xg, wg, &bg, yg);
      std::vector<bf16> got(size_t(m) * n);
      gpu->download(yg, got.data());
      EXPECT_LT(rel_l2(got, want), 1e-2) << format_name(format) << " m=" << m;
    }
  }
}

// The rows of tw in the gate/up tiled order (codes, NVFP4 block scales, FP8 channel scales).
TestWeight tiled_rows(const TestWeight& tw) {
  TestWeight out = tw;
  const size_t code_row = tw.data.size() / size_t(tw.n);
  for (int r = 0; r < tw.n; ++r) {
    const int src = kc::quant_gemm_gate_up_source_row(r, tw.n / 2);
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

// Host-only: a gate/up weight is packed exactly as its rows permuted into the tiled order would
// be without the mark; FP8 block weights and partial 32-row tiles stay in checkpoint order.
TEST(QuantGemmPack, GateUpWeightsArePackedTiled) {
  uint32_t seed = 400;
  for (WeightFormat format :
       {WeightFormat::kNvfp4, WeightFormat::kFp8PerChannel, WeightFormat::kFp8PerTensor}) {
    SCOPED_TRACE(format_name(format));
    const TestWeight tw = make_weight(format, 96, 128, seed++);
    backend::QuantizedWeight gate_up = host_weight(tw);
    gate_up.gate_up = true;
    const backend::cuda::PackedLinear got = backend::cuda::pack_quantized_linear(gate_up);
    const backend::cuda::PackedLinear want =
        backend::cuda::pack_quantized_linear(host_weight(tiled_rows(tw)));
    EXPECT_TRUE(got.rows_reordered);
    EXPECT_FALSE(want.rows_reordered);
    EXPECT_TRUE(got.data == want.data);
    EXPECT_TRUE(got.nvfp4_scales == want.nvfp4_scales);
    EXPECT_TRUE(got.channel_scales == want.channel_scales);
    EXPECT_FALSE(got.data == backend::cuda::pack_quantized_linear(host_weight(tw)).data);
  }
  const TestWeight odd = make_weight(WeightFormat::kNvfp4, 80, 128, seed++);  // 2.5 row tiles
  backend::QuantizedWeight w = host_weight(odd);
  w.gate_up = true;
  EXPECT_FALSE(backend::cuda::pack_quantized_linear(w).rows_reordered);
  backend::QuantizedWeight bad = host_weight(make_weight(WeightFormat::kNvfp4, 32, 128, seed++));
  bad.scales = Tensor{};
  EXPECT_THROW(backend::cuda::pack_quantized_linear(bad), InvalidArgument);
}

// Gate/up weights (QuantizedWeight::gate_up): the CUDA backend tiles their rows at upload and
// linear_silu_mul finishes silu(gate) · up in the decode GEMV's epilogue (m ≤ 8: S = 1, in-CTA and
// cross-CTA splits, depending on the shape) or runs the tiled product and silu_mul with tile 16
// (m = 20: the mma kernel; m = 100: dequantize + cuBLASLt). Against the CPU backend's linear +
// silu_mul on the same checkpoint weight.
TEST(QuantGemm, GateUpSiluMatchesCpuBackend) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto gpu = backend::make_cuda_backend();
  if (!gpu) GTEST_SKIP() << "CUDA backend unavailable: skipped";
  auto cpu = backend::make_cpu_backend();
  uint32_t seed = 300;
  struct Shape {
    int inter, k;
  };
  for (WeightFormat format :
       {WeightFormat::kNvfp4, WeightFormat::kFp8PerChannel, WeightFormat::kFp8PerTensor}) {
    for (const Shape& sh : {Shape{48, 512}, Shape{1024, 4096}, Shape{2048, 1024}}) {
      const int n = 2 * sh.inter, k = sh.k;
      SCOPED_TRACE(::testing::Message()
                   << format_name(format) << " inter " << sh.inter << " k " << k);
      backend::QuantizedWeight host = host_weight(make_weight(format, n, k, seed++));
      host.gate_up = true;
      const backend::Weight wc{Tensor{}, cpu->upload_quantized(host)};
      const backend::Weight wg{Tensor{}, gpu->upload_quantized(host)};
      ASSERT_TRUE(wg.q->rows_reordered);  // else this would test the unfused path only
      for (int m : {1, 3, 8, 13, 20, 100}) {
        SCOPED_TRACE(::testing::Message() << "m " << m);
        const BackendInput x = backend_input(*gpu, m, k, seed++);
        Tensor yc = host_empty(DType::kF32, {m, sh.inter});
        cpu->linear_silu_mul(x.cpu, wc, yc);
        const std::vector<float> want(yc.as<float>(), yc.as<float>() + size_t(m) * sh.inter);
        Tensor yg = gpu->empty(DType::kBF16, {m, sh.inter});
        cuda_check(cudaDeviceSynchronize(), "sync");
        cuda_check(cudaMemset(yg.data, 0xFF, yg.nbytes()), "poison");
        cuda_check(cudaDeviceSynchronize(), "sync");
        gpu->linear_silu_mul(x.gpu, wg, yg);
        std::vector<bf16> got(size_t(m) * sh.inter);
        gpu->download(yg, got.data());
        EXPECT_LT(rel_l2(got, want), 1e-2);
      }
      Tensor y = gpu->empty(DType::kBF16, {1, n});
      EXPECT_THROW(gpu->quantized_linear(backend_input(*gpu, 1, k, seed++).gpu, *wg.q, nullptr, y),
                   InvalidArgument);
    }
  }
}

// Random bytes stored straight into the device layout (speed does not depend on values); NVFP4
// scales are kept in a sane exponent range.
struct BenchWeight {
  DeviceBuffer<uint8_t> data, scales;
  size_t bytes;  // data + scales streamed per call
  kc::QuantGemmWeight w;

  static size_t scale_bytes(WeightFormat f, int n, int k) {
    return f == WeightFormat::kNvfp4
               ? size_t(kc::quant_gemm_n_pad(n)) * kc::quant_gemm_k_pad(k) / 16
               : size_t(n) * 4;
  }
  BenchWeight(WeightFormat f, int n, int k)
      : data(kc::quant_gemm_data_bytes(f, n, k)),
        scales(scale_bytes(f, n, k)),
        bytes(data.size() + scales.size()),
        w{f, n, k, data.get(), scales.get(), 1e-3f, 0, 0} {
    std::vector<uint8_t> host(std::max(data.size(), scales.size()));
    uint32_t state = 12345;
    for (auto& b : host) {
      state ^= state << 13;
      state ^= state >> 17;
      state ^= state << 5;
      b = uint8_t(state);
    }
    cuda_check(cudaMemcpy(data.get(), host.data(), data.size(), cudaMemcpyHostToDevice), "up");
    if (f == WeightFormat::kNvfp4) {
      for (size_t i = 0; i < scales.size(); ++i) host[i] = uint8_t(0x30 + (host[i] & 0x0F));
    } else {
      std::vector<float> s(n, 1e-3f);
      std::memcpy(host.data(), s.data(), scales.size());
    }
    cuda_check(cudaMemcpy(scales.get(), host.data(), scales.size(), cudaMemcpyHostToDevice), "up");
  }
};

// Weight bytes streamed per call (data + scales) / time and the fraction of the 4.3 TB/s floor,
// for the decode path (quant_gemv, m ≤ 16 where supported) and the mma kernel side by side (alone
// for m = 32, 64).
// Graph-timed over weight copies larger than L2, as in a decode step.
TEST(QuantGemmBench, DISABLED_Bandwidth) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (WeightFormat format : {WeightFormat::kNvfp4, WeightFormat::kFp8PerChannel}) {
    for (const BenchShape& s : kDecodeGemmShapes) {
      const size_t bytes =
          kc::quant_gemm_data_bytes(format, s.n, s.k) + BenchWeight::scale_bytes(format, s.n, s.k);
      const int copies = cold_copies(bytes);
      std::vector<std::unique_ptr<BenchWeight>> bws;
      for (int c = 0; c < copies; ++c)
        bws.push_back(std::make_unique<BenchWeight>(format, s.n, s.k));
      for (int m : {1, 2, 4, 8, 16, 32, 64}) {
        DeviceBuffer<bf16> x(random_bf16(size_t(m) * s.k, 7));
        DeviceBuffer<bf16> y(size_t(m) * s.n);
        DeviceBuffer<uint8_t> ws(std::max<size_t>(kc::quant_gemm_workspace_bytes(m, s.n, s.k), 1));
        kc::QuantGemmParams p{};
        p.x = x.get();
        p.w = bws[0]->w;
        p.y = y.get();
        p.m = m;
        p.workspace = ws.get();
        p.workspace_bytes = ws.size();
        const double old_us = cold_graph_us(copies, [&](cudaStream_t st, int c) {
          p.w = bws[size_t(c)]->w;
          kc::quant_gemm_mma(p, st);
        });
        const auto tbs = [&](double us) { return double(bytes) / (us * 1e-6) / 1e12; };
        std::printf("%-11s %-20s m=%2d n=%6d k=%6d (%7.1f MB) ", format_name(format), s.name, m,
                    s.n, s.k, double(bytes) / 1e6);
        if (kc::quant_gemv_supported(p)) {
          const double new_us = cold_graph_us(copies, [&](cudaStream_t st, int c) {
            p.w = bws[size_t(c)]->w;
            kc::quant_gemv(p, st);
          });
          std::printf("gemv %7.1f us %5.2f TB/s (%5.1f%%)  ", new_us, tbs(new_us),
                      100.0 * tbs(new_us) / kCopyTbPerS);
          std::printf("mma %7.1f us %5.2f TB/s  speedup %.2fx\n", old_us, tbs(old_us),
                      old_us / new_us);
        } else {
          std::printf("gemv      -                          mma %7.1f us %5.2f TB/s (%5.1f%%)\n",
                      old_us, tbs(old_us), 100.0 * tbs(old_us) / kCopyTbPerS);
        }
      }
    }
  }
}

// The prefill path's dequantize (m > kQuantGemmMaxM): bytes read + bf16 bytes written / time.
TEST(QuantGemmBench, DISABLED_Dequant) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (WeightFormat format : {WeightFormat::kNvfp4, WeightFormat::kFp8PerChannel}) {
    for (const BenchShape& s : kDecodeGemmShapes) {
      const BenchWeight bw(format, s.n, s.k);
      DeviceBuffer<bf16> out(size_t(s.n) * s.k);
      const double us = median_us([&] { kc::quant_dequant_bf16(bw.w, out.get(), nullptr); });
      const double bytes = double(bw.bytes) + double(s.n) * s.k * 2;
      const double tbs = bytes / (us * 1e-6) / 1e12;
      std::printf("dequant %-11s %-20s n=%6d k=%6d  %8.1f us  %6.3f TB/s (%5.1f%% of copy)\n",
                  format_name(format), s.name, s.n, s.k, us, tbs, 100.0 * tbs / kCopyTbPerS);
    }
  }
}

}  // namespace
}  // namespace serval::testing
