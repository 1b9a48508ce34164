// CUDA bf16 small-M GEMM (kernels::cuda::small_m_gemm) against the CPU oracle kernels::cpu::linear
// on the same bf16 inputs. Outputs are poisoned (0xFF → NaN) before every call, so an unwritten
// element fails. Tolerances (rel L2 over the whole output):
//   f32 output: 1e-4 (bf16 × bf16 products are exact in fp32; only the summation order differs);
//   bf16 output: 1e-2 (each output rounded to bf16, ≤ 2^-9 relative).
// SmallMGemmBench.DISABLED_VsCublasLt times the kernel and cuBLASLt on the decode shapes
// (--gtest_also_run_disabled_tests --gtest_filter='SmallMGemmBench.*').
#include "kernels/cuda/gemm/small_m_gemm.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cuda/gemm_cublaslt.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gemm_bench_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

namespace kc = kernels::cuda;

struct Problem {
  int n, k, max_m;  // max_m bounds the CPU oracle's cost
};

// Runs small_m_gemm on device buffers; returns the output as float.
std::vector<float> run_gpu(const DeviceBuffer<bf16>& x, const DeviceBuffer<bf16>& w,
                           const bf16* bias, int m, int n, int k, bool f32) {
  DeviceBuffer<uint8_t> ws(std::max<size_t>(kc::small_m_gemm_workspace_bytes(m, n, k), 1));
  DeviceBuffer<float> yf(size_t(m) * n);
  DeviceBuffer<bf16> yb(size_t(m) * n);
  yf.poison();
  yb.poison();
  kc::SmallMGemmParams p{};
  p.x = x.get();
  p.w = w.get();
  p.bias = bias;
  p.y = f32 ? static_cast<void*>(yf.get()) : static_cast<void*>(yb.get());
  p.y_f32 = f32;
  p.m = m;
  p.n = n;
  p.k = k;
  p.workspace = ws.get();
  p.workspace_bytes = ws.size();
  kc::small_m_gemm(p, nullptr);
  return f32 ? yf.download() : to_float(yb.download());
}

TEST(SmallMGemm, MatchesCpuOracle) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // n not a multiple of 16 (200, 333), k not a multiple of 32 or 128 (72, 1000), split-K shapes
  // (small n, large k) and single-split ones.
  const Problem problems[] = {
      {200, 72, 64}, {333, 1000, 64}, {2048, 1024, 64}, {1536, 4096, 64}, {4100, 264, 64}};
  const int ms[] = {1, 2, 3, 7, 8, 9, 16, 17, 33, 64};
  uint32_t seed = 11;
  int variant = 0;
  for (const Problem& s : problems) {
    const std::vector<bf16> wb = random_bf16(size_t(s.n) * s.k, seed++);
    const std::vector<bf16> xb = random_bf16(size_t(s.max_m) * s.k, seed++);
    const std::vector<bf16> bias_b = random_bf16(s.n, seed++, -0.5f, 0.5f);
    const std::vector<float> xf = to_float(xb), bias_f = to_float(bias_b);
    // One oracle run at max_m without bias; smaller m use the leading rows (rows are independent).
    std::vector<float> want(size_t(s.max_m) * s.n);
    kernels::cpu::linear(
        {xf.data(), wb.data(), DType::kBF16, nullptr, want.data(), s.max_m, s.n, s.k});
    DeviceBuffer<bf16> x(xb), w(wb), bias(bias_b);
    for (int m : ms) {
      if (m > s.max_m) continue;
      const bool with_bias = variant % 2 == 0, f32 = variant % 3 != 1;
      ++variant;
      std::vector<float> ref(want.begin(), want.begin() + size_t(m) * s.n);
      if (with_bias)
        for (int r = 0; r < m; ++r)
          for (int c = 0; c < s.n; ++c) ref[size_t(r) * s.n + c] += bias_f[c];
      const std::vector<float> got =
          run_gpu(x, w, with_bias ? bias.get() : nullptr, m, s.n, s.k, f32);
      EXPECT_LT(rel_l2(got, ref), f32 ? 1e-4 : 1e-2)
          << "m=" << m << " n=" << s.n << " k=" << s.k << (with_bias ? " bias" : "")
          << (f32 ? " f32" : " bf16") << " splits workspace "
          << kc::small_m_gemm_workspace_bytes(m, s.n, s.k);
    }
  }
}

// The split-K reduction runs in a fixed order: two runs give identical bits.
TEST(SmallMGemm, Deterministic) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const int m = 5, n = 256, k = 8192;
  ASSERT_GT(kc::small_m_gemm_workspace_bytes(m, n, k), 0u) << "shape chosen to split K";
  DeviceBuffer<bf16> x(random_bf16(size_t(m) * k, 31)), w(random_bf16(size_t(n) * k, 32));
  const std::vector<float> a = run_gpu(x, w, nullptr, m, n, k, true);
  const std::vector<float> b = run_gpu(x, w, nullptr, m, n, k, true);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(SmallMGemm, SupportedShapes) {
  alignas(16) static bf16 buf[16];
  EXPECT_TRUE(kc::small_m_gemm_supported(buf, buf, 1, 8));
  EXPECT_TRUE(kc::small_m_gemm_supported(buf, buf, kc::kSmallMGemmMaxM, 4096));
  EXPECT_FALSE(kc::small_m_gemm_supported(buf, buf, 0, 8));
  EXPECT_FALSE(kc::small_m_gemm_supported(buf, buf, kc::kSmallMGemmMaxM + 1, 8));
  EXPECT_FALSE(kc::small_m_gemm_supported(buf, buf, 1, 12));     // k % 8 != 0
  EXPECT_FALSE(kc::small_m_gemm_supported(buf + 1, buf, 1, 8));  // x not 16-byte aligned
  EXPECT_FALSE(kc::small_m_gemm_supported(buf, buf + 1, 1, 8));  // w not 16-byte aligned
}

// Per shape and m: the kernel's µs, weight TB/s and fraction of the 4.3 TB/s floor, and
// cuBLASLt's µs for the same problem, so the backend's crossover (kSmallMLinearMaxM in
// cuda_backend.cpp) can be set from one run.
TEST(SmallMGemmBench, DISABLED_VsCublasLt) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  backend::cuda::CublasLtGemm lt;
  std::printf("graph-timed, weights cycled over copies larger than L2 (cold weights)\n");
  for (const BenchShape& s : kDecodeGemmShapes) {
    const size_t bytes = size_t(s.n) * s.k * 2;
    if (bytes > (size_t(1) << 30)) continue;  // the LM head is cuBLASLt's either way
    const int copies = cold_copies(bytes);
    std::vector<std::unique_ptr<DeviceBuffer<bf16>>> ws;
    for (int c = 0; c < copies; ++c)
      ws.push_back(std::make_unique<DeviceBuffer<bf16>>(random_bf16(size_t(s.n) * s.k, 5 + c)));
    for (int m : {1, 2, 4, 8, 16, 64}) {
      DeviceBuffer<bf16> x(random_bf16(size_t(m) * s.k, 7));
      DeviceBuffer<bf16> y(size_t(m) * s.n);
      DeviceBuffer<uint8_t> scratch(
          std::max<size_t>(kc::small_m_gemm_workspace_bytes(m, s.n, s.k), 1));
      kc::SmallMGemmParams p{};
      p.x = x.get();
      p.y = y.get();
      p.m = m;
      p.n = s.n;
      p.k = s.k;
      p.workspace = scratch.get();
      p.workspace_bytes = scratch.size();
      const double us = graph_us(copies, [&](cudaStream_t st, int c) {
        p.w = ws[size_t(c)]->get();
        kc::small_m_gemm(p, st);
      });
      const double lt_us = graph_us(copies, [&](cudaStream_t st, int c) {
        lt.run(x.get(), ws[size_t(c)]->get(), nullptr, y.get(), DType::kBF16, m, s.n, s.k, st);
      });
      const double tbs = double(bytes) / (us * 1e-6) / 1e12;
      std::printf(
          "bf16 %-20s m=%3d n=%6d k=%6d  %s %8.1f us %6.3f TB/s (%5.1f%% of floor)  "
          "cublasLt %8.1f us %6.3f TB/s  speedup %.2fx\n",
          s.name, m, s.n, s.k, m <= kc::kBf16GemvMaxM ? "gemv   " : "small_m", us, tbs,
          100.0 * tbs / kCopyTbPerS, lt_us, double(bytes) / (lt_us * 1e-6) / 1e12, lt_us / us);
    }
  }
}

}  // namespace
}  // namespace serval::testing
