// CUDA bf16 GEMV (kernels::cuda::bf16_gemv) against the CPU oracle kernels::cpu::linear
// on the same bf16 inputs. Outputs are poisoned (0xFF → NaN) before every call, so an unwritten
// element fails. Tolerances (rel L2 over the whole output):
//   f32 output: 1e-4 (bf16 × bf16 products are exact in fp32; only the summation order differs);
//   bf16 output: 1e-2 (each output rounded to bf16, ≤ 2^-9 relative).
// Bf16GemvBench.DISABLED_VsCublasLt times the kernel and cuBLASLt on the decode shapes
// (--gtest_also_run_disabled_tests --gtest_filter='Bf16GemvBench.*').
#include "kernels/cuda/gemm/bf16_gemv.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cuda/gemm_cublaslt.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gemm_bench_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

namespace kc = kernels::cuda;

struct Problem {
  int n, k, max_m;  // max_m bounds the CPU oracle's cost
};

// Runs bf16_gemv (bulk_ctas_per_sm = 0) or bf16_gemv_bulk with that many CTAs per SM on device
// buffers; returns the output as float.
std::vector<float> run_gpu(const DeviceBuffer<bf16>& x, const DeviceBuffer<bf16>& w,
                           const bf16* bias, int m, int n, int k, bool f32,
                           int bulk_ctas_per_sm = 0) {
  DeviceBuffer<float> yf(size_t(m) * n);
  DeviceBuffer<bf16> yb(size_t(m) * n);
  yf.poison();
  yb.poison();
  void* y = f32 ? static_cast<void*>(yf.get()) : static_cast<void*>(yb.get());
  const kc::Bf16GemvParams p{x.get(), w.get(), bias, y, f32, m, n, k};
  if (bulk_ctas_per_sm > 0) {
    kc::bf16_gemv_bulk(p, bulk_ctas_per_sm, nullptr);
  } else {
    kc::bf16_gemv(p, nullptr);
  }
  return f32 ? yf.download() : to_float(yb.download());
}

// Every m of every problem against the CPU oracle, with and without bias, f32 and bf16 outputs;
// bulk_ctas_per_sm as in run_gpu, or -1: bf16_gemv_bulk cycling through 1, 2 and 3 CTAs per SM.
void expect_matches_oracle(const std::vector<Problem>& problems, int bulk_ctas_per_sm) {
  const int ms[] = {1, 2, 3, 4};
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
      const int ctas = bulk_ctas_per_sm < 0 ? 1 + variant % 3 : bulk_ctas_per_sm;
      const std::vector<float> got =
          run_gpu(x, w, with_bias ? bias.get() : nullptr, m, s.n, s.k, f32, ctas);
      EXPECT_LT(rel_l2(got, ref), f32 ? 1e-4 : 1e-2)
          << "m=" << m << " n=" << s.n << " k=" << s.k << (with_bias ? " bias" : "")
          << (f32 ? " f32" : " bf16") << " bulk CTAs per SM " << ctas;
    }
  }
}

TEST(Bf16Gemv, MatchesCpuOracle) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // Odd n (333: the last row pair has one row), k not a multiple of the 256-column slice or of
  // the 1024-column stage (72, 1000, 264), k over several stages (4096, 8200), and n large enough
  // (40000) that warps take several row pairs each through one register ring.
  expect_matches_oracle({{200, 72, 4},
                         {333, 1000, 4},
                         {2048, 1024, 4},
                         {1536, 4096, 4},
                         {4100, 264, 4},
                         {40000, 2048, 4},
                         {96, 8200, 4}},
                        0);
}

TEST(Bf16GemvBulk, MatchesCpuOracle) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // Stages of 64 rows (256), of 2 rows with a third of the stage unused (3072), of one row
  // (8192); CTAs with one partial stage (7 rows), spans that split stages unevenly (333, 5120 over
  // 132-396 CTAs), and many stages per CTA (40000 rows).
  expect_matches_oracle({{200, 256, 4},
                         {333, 3072, 4},
                         {5120, 2048, 4},
                         {2048, 4096, 4},
                         {7, 8192, 4},
                         {40000, 1024, 4},
                         {130, 2560, 4}},
                        -1);
}

// Each output is one warp's fixed-order sum: two runs give identical bits.
TEST(Bf16Gemv, Deterministic) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const int m = 3, n = 40000, k = 2048;
  DeviceBuffer<bf16> x(random_bf16(size_t(m) * k, 31)), w(random_bf16(size_t(n) * k, 32));
  const std::vector<float> a = run_gpu(x, w, nullptr, m, n, k, true);
  const std::vector<float> b = run_gpu(x, w, nullptr, m, n, k, true);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// A fixed summation order per output, whatever the grid: two runs give identical bits.
TEST(Bf16GemvBulk, Deterministic) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const int m = 3, n = 5120, k = 2048;
  DeviceBuffer<bf16> x(random_bf16(size_t(m) * k, 33)), w(random_bf16(size_t(n) * k, 34));
  const std::vector<float> a = run_gpu(x, w, nullptr, m, n, k, true, 2);
  const std::vector<float> b = run_gpu(x, w, nullptr, m, n, k, true, 2);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(Bf16GemvBulk, SupportedShapes) {
  alignas(16) static bf16 buf[16];
  EXPECT_TRUE(kc::bf16_gemv_bulk_supported(buf, buf, 1, 256));
  EXPECT_TRUE(kc::bf16_gemv_bulk_supported(buf, buf, kc::kBf16GemvMaxM, 8192));
  EXPECT_FALSE(kc::bf16_gemv_bulk_supported(buf, buf, 1, 264));   // k % 256 != 0
  EXPECT_FALSE(kc::bf16_gemv_bulk_supported(buf, buf, 1, 8448));  // a row over one stage
  EXPECT_FALSE(kc::bf16_gemv_bulk_supported(buf, buf, kc::kBf16GemvMaxM + 1, 256));
  EXPECT_FALSE(kc::bf16_gemv_bulk_supported(buf, buf + 1, 1, 256));
}

TEST(Bf16Gemv, SupportedShapes) {
  alignas(16) static bf16 buf[16];
  EXPECT_TRUE(kc::bf16_gemv_supported(buf, buf, 1, 8));
  EXPECT_TRUE(kc::bf16_gemv_supported(buf, buf, kc::kBf16GemvMaxM, 4096));
  EXPECT_FALSE(kc::bf16_gemv_supported(buf, buf, 0, 8));
  EXPECT_FALSE(kc::bf16_gemv_supported(buf, buf, kc::kBf16GemvMaxM + 1, 8));
  EXPECT_FALSE(kc::bf16_gemv_supported(buf, buf, 1, 12));     // k % 8 != 0
  EXPECT_FALSE(kc::bf16_gemv_supported(buf + 1, buf, 1, 8));  // x not 16-byte aligned
  EXPECT_FALSE(kc::bf16_gemv_supported(buf, buf + 1, 1, 8));  // w not 16-byte aligned
}

// Per shape and m: the GEMV's µs, weight TB/s and fraction of the 4.3 TB/s floor, and cuBLASLt's
// µs for the same problem, so the backend's crossover (CudaBackend::linear) can be set from one
// run. Graph-timed over weight copies larger than L2, as in a decode step.
TEST(Bf16GemvBench, DISABLED_VsCublasLt) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  backend::cuda::CublasLtGemm lt;
  for (const BenchShape& s : kDecodeGemmShapes) {
    const size_t bytes = size_t(s.n) * s.k * 2;
    if (bytes > (size_t(1) << 30)) continue;  // Llama's 2 GB LM head: too large to cycle copies
    const int copies = cold_copies(bytes);
    std::vector<std::unique_ptr<DeviceBuffer<bf16>>> ws;
    for (int c = 0; c < copies; ++c)
      ws.push_back(std::make_unique<DeviceBuffer<bf16>>(random_bf16(size_t(s.n) * s.k, 5 + c)));
    // An LM head writes f32 logits; the other layers bf16 activations.
    const bool f32 = std::strstr(s.name, "lm_head") != nullptr;
    for (int m : {1, 2, 4}) {
      DeviceBuffer<bf16> x(random_bf16(size_t(m) * s.k, 7));
      DeviceBuffer<float> y(size_t(m) * s.n);  // room for either output dtype
      kc::Bf16GemvParams p{x.get(), nullptr, nullptr, y.get(), f32, m, s.n, s.k};
      const double us = cold_graph_us(copies, [&](cudaStream_t st, int c) {
        p.w = ws[size_t(c)]->get();
        kc::bf16_gemv(p, st);
      });
      const double lt_us = cold_graph_us(copies, [&](cudaStream_t st, int c) {
        lt.run(x.get(), ws[size_t(c)]->get(), nullptr, y.get(), f32 ? DType::kF32 : DType::kBF16, m,
               s.n, s.k, st);
      });
      double bulk_us[4] = {0, 0, 0, 0};
      if (kc::bf16_gemv_bulk_supported(x.get(), ws[0]->get(), m, s.k))
        for (int ctas = 1; ctas <= 3; ++ctas)
          bulk_us[ctas] = cold_graph_us(copies, [&](cudaStream_t st, int c) {
            p.w = ws[size_t(c)]->get();
            kc::bf16_gemv_bulk(p, ctas, st);
          });
      const double tbs = double(bytes) / (us * 1e-6) / 1e12;
      std::printf("bf16 %-20s m=%3d bulk µs at 1 / 2 / 3 CTAs per SM: %.1f / %.1f / %.1f\n", s.name,
                  m, bulk_us[1], bulk_us[2], bulk_us[3]);
      std::printf(
          "bf16 %-20s m=%3d n=%6d k=%6d  gemv %8.1f us %6.3f TB/s (%5.1f%% of floor)  "
          "cublasLt %8.1f us %6.3f TB/s  speedup %.2fx\n",
          s.name, m, s.n, s.k, us, tbs, 100.0 * tbs / kCopyTbPerS, lt_us,
          double(bytes) / (lt_us * 1e-6) / 1e12, lt_us / us);
    }
  }
}

}  // namespace
}  // namespace serval::testing
