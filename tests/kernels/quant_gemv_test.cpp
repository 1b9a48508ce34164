// CUDA quant_gemv (the decode path of the weight-only quantized GEMMs, 1 ≤ m ≤ 16) against the
// CPU oracle and the mma kernel: every format, padded shapes, cross-CTA K splits, determinism,
// graph replays and the host-side routing rules. Weights, oracle and tolerances as
// quant_gemm_test.cpp.
#include "kernels/cuda/gemm/quant_gemv.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/norm_rope/rms_norm.h"
#include "quant_gemm_test_support.h"

namespace serval::testing {
namespace {

// The decode path (quant_gemv, 1 ≤ m ≤ 8) against the CPU oracle for every format, through both
// quant_gemm's dispatch and quant_gemv itself, on padded shapes (n % 32 != 0, k % 64 != 0), a
// large n and a large k; both output dtypes, with and without bias, 16-byte and 4-byte aligned x.
// Tolerances as MatchesCpuOracle.
TEST(QuantGemv, MatchesCpuOracle) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  constexpr int M = kc::kQuantGemvMaxM;
  const Shape2 shapes[] = {{200, 80, M},    {33, 16, M},   {1000, 1088, M},
                           {40010, 256, M}, {72, 8240, M}, {5120, 2048, M}};
  uint32_t seed = 300;
  int variant = 0;
  for (WeightFormat format : kFormats) {
    for (const Shape2& s : shapes) {
      const TestWeight tw = make_weight(format, s.n, s.k, seed++);
      DeviceWeight dw(tw);
      // Two spare leading elements: x + 2 is 4-byte but not 16-byte aligned.
      const std::vector<bf16> xb = random_bf16(size_t(s.max_m) * s.k + 2, seed++);
      const std::vector<float> xall = to_float(xb);
      const std::vector<bf16> bias_b = random_bf16(s.n, seed++, -0.5f, 0.5f);
      const std::vector<float> bias_f = to_float(bias_b);
      DeviceBuffer<bf16> x(xb), bias(bias_b);
      for (int m = 1; m <= kc::kQuantGemvMaxM; ++m) {
        const bool with_bias = variant % 2 == 0, f32 = variant % 3 != 1, shifted = variant % 5 == 2;
        ++variant;
        const size_t x0 = shifted ? 2 : 0;
        const std::vector<float> xf(xall.begin() + x0, xall.begin() + x0 + size_t(m) * s.k);
        std::vector<float> ref(size_t(m) * s.n);
        kernels::QuantLinearParams cp = cpu_params(tw);
        cp.x = xf.data();
        cp.y = ref.data();
        cp.m = m;
        kernels::cpu::quant_linear(cp);
        if (with_bias)
          for (int r = 0; r < m; ++r)
            for (int c = 0; c < s.n; ++c) ref[size_t(r) * s.n + c] += bias_f[c];
        kc::QuantGemmParams probe{};
        probe.w = dw.w;
        probe.m = m;
        ASSERT_TRUE(kc::quant_gemv_supported(probe))
            << format_name(format) << " m=" << m << " n=" << s.n << " k=" << s.k;
        const double tol = (!f32 || format == WeightFormat::kFp8Block) ? 1e-2 : 1e-4;
        for (Path path : {Path::kDispatch, Path::kGemv}) {
          const std::vector<float> got =
              run_path(path, dw.w, x.get() + x0, with_bias ? bias.get() : nullptr, m, f32);
          EXPECT_LT(rel_l2(got, ref), tol)
              << format_name(format) << (path == Path::kGemv ? " gemv" : " dispatch") << " m=" << m
              << " n=" << s.n << " k=" << s.k << (with_bias ? " bias" : "")
              << (f32 ? " f32" : " bf16") << (shifted ? " x+4B" : "");
        }
      }
    }
  }
}

// Same dequantized values, fp32 accumulation in another order: the decode path and the mma
// kernel agree to fp32 summation noise (f32 output, rel L2 < 3e-5: ~2^-24·sqrt(k) for k = 16384
// plus tensor-core accumulation truncation; a wrong scale, row or column mapping gives O(1)).
TEST(QuantGemv, MatchesMmaKernel) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  constexpr int M = kc::kQuantGemvMaxM;
  const Shape2 shapes[] = {{300, 208, M}, {2048, 4096, M}, {57, 28672, M}};
  uint32_t seed = 400;
  for (WeightFormat format : kFormats) {
    for (const Shape2& s : shapes) {
      const TestWeight tw = make_weight(format, s.n, s.k, seed++);
      DeviceWeight dw(tw);
      DeviceBuffer<bf16> x(random_bf16(size_t(s.max_m) * s.k, seed++));
      DeviceBuffer<bf16> bias(random_bf16(s.n, seed++, -0.5f, 0.5f));
      for (int m = 1; m <= kc::kQuantGemvMaxM; ++m) {
        const std::vector<float> a = run_path(Path::kGemv, dw.w, x.get(), bias.get(), m, true);
        const std::vector<float> b = run_path(Path::kMma, dw.w, x.get(), bias.get(), m, true);
        EXPECT_LT(rel_l2(a, b), 3e-5)
            << format_name(format) << " m=" << m << " n=" << s.n << " k=" << s.k;
      }
    }
  }
}

// Fixed split order in the reductions (shared memory or cross-CTA): two runs give identical bits.
TEST(QuantGemv, Deterministic) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (WeightFormat format : {WeightFormat::kNvfp4, WeightFormat::kFp8PerChannel}) {
    const int n = 5000, k = 4096;
    const TestWeight tw = make_weight(format, n, k, 500);
    DeviceWeight dw(tw);
    DeviceBuffer<bf16> x(random_bf16(size_t(kc::kQuantGemvMaxM) * k, 501));
    for (int m : {1, 8, 16}) {
      const std::vector<float> a = run_path(Path::kGemv, dw.w, x.get(), nullptr, m, true);
      const std::vector<float> b = run_path(Path::kGemv, dw.w, x.get(), nullptr, m, true);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << format_name(format) << " m=" << m;
    }
  }
}

// Shapes whose K splits of one tile run in different CTAs and merge through the device-global
// workspace (quant_gemv_split.h's choice on a 132-SM H200 for 16 / 25 / 19 resident warps per SM:
// NVFP4 / FP8 / FP8 block): 133 and 265 tiles (just above multiples of 132) and 40 tiles of a
// padded k. Every m in 1..16 (one and two token blocks), the three kernel kinds, against the CPU
// oracle (tolerances as MatchesCpuOracle) and the mma kernel (f32 outputs: 3e-5 as
// MatchesMmaKernel).
constexpr Shape2 kCrossCtaShapes[] = {{4250, 2048, kc::kQuantGemvMaxM},
                                      {8460, 2048, kc::kQuantGemvMaxM},
                                      {1250, 8256, kc::kQuantGemvMaxM}};
constexpr WeightFormat kKernelKinds[] = {WeightFormat::kNvfp4, WeightFormat::kFp8PerChannel,
                                         WeightFormat::kFp8Block};

TEST(QuantGemv, CrossCtaSplitsMatchCpuOracle) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 600;
  int variant = 0;
  for (WeightFormat format : kKernelKinds) {
    for (const Shape2& s : kCrossCtaShapes) {
      OracleCase o = make_oracle_case(format, s, seed);
      std::vector<float>& want = o.want;  // with the bias
      for (int r = 0; r < s.max_m; ++r)
        for (int c = 0; c < s.n; ++c) want[size_t(r) * s.n + c] += o.bias_f[c];
      DeviceWeight dw(o.tw);
      DeviceBuffer<bf16> x(o.xb), bias(o.bias_b);
      for (int m = 1; m <= s.max_m; ++m) {
        const bool f32 = variant++ % 2 == 0;
        const std::vector<float> ref(want.begin(), want.begin() + size_t(m) * s.n);
        const std::vector<float> got = run_path(Path::kGemv, dw.w, x.get(), bias.get(), m, f32);
        const double tol = (!f32 || format == WeightFormat::kFp8Block) ? 1e-2 : 1e-4;
        EXPECT_LT(rel_l2(got, ref), tol) << format_name(format) << " m=" << m << " n=" << s.n
                                         << " k=" << s.k << (f32 ? " f32" : " bf16");
        if (f32) {
          const std::vector<float> mma = run_path(Path::kMma, dw.w, x.get(), bias.get(), m, true);
          EXPECT_LT(rel_l2(got, mma), 3e-5)
              << format_name(format) << " vs mma m=" << m << " n=" << s.n << " k=" << s.k;
        }
      }
    }
  }
}

// The arrival counters reset themselves: back-to-back launches in one stream (no sync between
// them, other shapes interleaved so a stale count would make the wrong warp merge early) and
// replays of a captured graph give the first eager call's bits exactly.
TEST(QuantGemv, BackToBackAndGraphReplayBitExact) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  uint32_t seed = 700;
  for (WeightFormat format : kKernelKinds) {
    const TestWeight ta = make_weight(format, 8460, 2048, seed++);  // 265 tiles: cross-CTA
    const TestWeight tb = make_weight(format, 1250, 8256, seed++);  // 40 tiles: cross-CTA
    const TestWeight tc = make_weight(format, 1000, 1088, seed++);  // in-CTA splits
    DeviceWeight wa(ta), wb(tb), wc(tc);
    const DeviceWeight* ws[] = {&wa, &wb, &wc};
    DeviceBuffer<bf16> x(random_bf16(size_t(kc::kQuantGemvMaxM) * 8256, seed++));
    for (int m : {1, 5, 8, 9, 16}) {
      // Reference: one eager call per weight, synchronized.
      std::vector<std::vector<float>> ref;
      for (const DeviceWeight* w : ws)
        ref.push_back(run_path(Path::kGemv, w->w, x.get(), nullptr, m, true));
      std::vector<std::unique_ptr<DeviceBuffer<float>>> ys;
      for (const DeviceWeight* w : ws)
        ys.push_back(std::make_unique<DeviceBuffer<float>>(size_t(m) * w->w.n));
      // a, b, c, a, b, c: each output written twice, the last write checked.
      auto enqueue = [&](cudaStream_t st) {
        for (int rep = 0; rep < 2; ++rep)
          for (size_t i = 0; i < 3; ++i) {
            kc::QuantGemmParams p{};
            p.x = x.get();
            p.w = ws[i]->w;
            p.y = ys[i]->get();
            p.y_f32 = true;
            p.m = m;
            kc::quant_gemv(p, st);
          }
      };
      auto verify = [&](const char* how) {
        for (size_t i = 0; i < 3; ++i) {
          const std::vector<float> got = ys[i]->download();
          ASSERT_EQ(got.size(), ref[i].size());
          EXPECT_EQ(std::memcmp(got.data(), ref[i].data(), got.size() * sizeof(float)), 0)
              << how << " " << format_name(format) << " m=" << m << " weight " << i;
        }
      };
      for (int rep = 0; rep < 3; ++rep) {
        for (auto& y : ys) y->poison();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        enqueue(stream);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        verify("back-to-back");
      }
      const CapturedGraph graph(stream, enqueue);
      for (int rep = 0; rep < 3; ++rep) {
        for (auto& y : ys) y->poison();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        graph.launch(stream);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        verify("graph");
      }
    }
  }
  cudaStreamDestroy(stream);
}

// Host-side routing rules (no GPU needed).
TEST(QuantGemv, SupportedShapes) {
  alignas(16) static uint8_t scales[16];
  kc::QuantGemmParams p{};
  p.w = kc::QuantGemmWeight{WeightFormat::kNvfp4, 4096, 4096, nullptr, scales, 1.0f, 0, 0};
  for (int m = 1; m <= 16; ++m) {
    p.m = m;
    EXPECT_TRUE(kc::quant_gemv_supported(p)) << m;
  }
  p.m = 0;
  EXPECT_FALSE(kc::quant_gemv_supported(p));
  p.m = 17;
  EXPECT_FALSE(kc::quant_gemv_supported(p));
  p.m = 16;
  p.w.k = 28672;  // Llama-70B down: activations are read from global memory, any k
  EXPECT_TRUE(kc::quant_gemv_supported(p));
  p.w.format = WeightFormat::kFp8PerChannel;
  p.w.k = 4095;  // token rows must be whole bf16 pairs
  EXPECT_FALSE(kc::quant_gemv_supported(p));
  p.w.format = WeightFormat::kNvfp4;
  p.m = 4;
  p.w.k = 4096;
  p.w.scales = scales + 1;  // scales not 4-byte aligned
  EXPECT_FALSE(kc::quant_gemv_supported(p));
  p.w.scales = scales;
  p.w.format = WeightFormat::kFp8Block;
  p.w.block_n = p.w.block_k = 128;
  EXPECT_TRUE(kc::quant_gemv_supported(p));
  p.w.block_k = 32;  // several multipliers per 64-column block
  EXPECT_FALSE(kc::quant_gemv_supported(p));
  p.w.block_k = 128;
  p.w.block_n = 16;
  EXPECT_FALSE(kc::quant_gemv_supported(p));
  p.w.format = WeightFormat::kFp8PerTensor;
  p.w.scales = nullptr;
  EXPECT_TRUE(kc::quant_gemv_supported(p));
  // The SwiGLU epilogue: whole 32-row tiles, bf16 out, no bias.
  p.swiglu = true;
  EXPECT_TRUE(kc::quant_gemv_supported(p));
  p.w.n = 4096 + 16;
  EXPECT_FALSE(kc::quant_gemv_supported(p));
  p.w.n = 4096;
  p.y_f32 = true;
  EXPECT_FALSE(kc::quant_gemv_supported(p));
  p.y_f32 = false;
  alignas(16) static bf16 bias[1];
  p.bias = bias;
  EXPECT_FALSE(kc::quant_gemv_supported(p));
}

}  // namespace
}  // namespace serval::testing
