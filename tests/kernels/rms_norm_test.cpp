// CUDA rms_norm (with and without the fused residual add) against the CPU twin.
#include "kernels/cuda/norm_rope/rms_norm.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "kernels/bench_timing.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

// bf16 outputs of fp32 math: rounding alone gives ~2e-3 rel L2; 1e-2 leaves room for
// summation-order differences while any indexing error gives O(1).
constexpr double kTol = 1e-2;

void check_rms_norm(int rows, int hidden, bool with_residual, bool in_place) {
  SCOPED_TRACE(::testing::Message() << "rows=" << rows << " hidden=" << hidden
                                    << " residual=" << with_residual << " in_place=" << in_place);
  const uint32_t seed = uint32_t(rows * 131 + hidden + with_residual * 7 + in_place * 3);
  auto x = random_bf16(size_t(rows) * hidden, seed, -2.0f, 2.0f);
  auto res = random_bf16(size_t(rows) * hidden, seed + 1, -2.0f, 2.0f);
  auto w = random_bf16(hidden, seed + 2, 0.5f, 1.5f);

  // CPU twin on the same bf16-rounded inputs.
  std::vector<float> x_f = to_float(x), res_f = to_float(res), want(x.size());
  kernels::cpu::rms_norm({x_f.data(), with_residual ? res_f.data() : nullptr, w.data(),
                          DType::kBF16, want.data(), rows, hidden, 1e-6f});

  DeviceBuffer<bf16> d_x(x), d_res(res), d_w(w), d_out(x.size());
  d_out.poison();
  bf16* out = in_place ? d_x.get() : d_out.get();
  kernels::cuda::rms_norm(
      {d_x.get(), with_residual ? d_res.get() : nullptr, d_w.get(), out, rows, hidden, 1e-6f},
      nullptr);
  auto got = in_place ? d_x.download() : d_out.download();
  EXPECT_LT(rel_l2(got, want), kTol);
  if (with_residual) {
    EXPECT_LT(rel_l2(d_res.download(), res_f), kTol) << "residual not updated to x + residual";
  } else {
    EXPECT_EQ(rel_l2(d_res.download(), to_float(res)), 0.0) << "residual touched without request";
  }
}

TEST(CudaRmsNorm, MatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // 64..8192 keep the row in registers (1, 2 or 4 vectors per thread; 5120 leaves some idle),
  // 12288 takes the two-pass kernel.
  for (int hidden : {64, 2048, 4096, 5120, 8192, 12288})
    for (int rows : {1, 7, 256})
      for (bool residual : {false, true}) check_rms_norm(rows, hidden, residual, false);
}

TEST(CudaRmsNorm, OutputMayAliasInput) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  check_rms_norm(7, 2048, false, true);
  check_rms_norm(7, 2048, true, true);
}

// Rows wider than 2048 run over a cluster of CTAs while rows · CTAs per row ≤ the SM count
// (decode steps) and in one CTA per row otherwise; both must give the same bits, so a token's
// result does not depend on the batch it is in. 200 rows take the one-CTA kernel, their first
// 1 and 8 the cluster kernel; 3072 and 5120 leave the last CTA of a row partly idle.
TEST(CudaRmsNorm, ClusterRowsEqualOneCtaRows) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  constexpr int kRows = 200;
  for (int hidden : {3072, 4096, 5120, 8192})
    for (bool with_residual : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "hidden=" << hidden << " residual=" << with_residual);
      const size_t n = size_t(kRows) * hidden;
      const auto x = random_bf16(n, uint32_t(hidden), -2.0f, 2.0f);
      const auto res = random_bf16(n, uint32_t(hidden) + 1, -2.0f, 2.0f);
      const auto w = random_bf16(hidden, uint32_t(hidden) + 2, 0.5f, 1.5f);
      auto run = [&](int rows, std::vector<bf16>* residual_out) {
        DeviceBuffer<bf16> d_x(x), d_res(res), d_w(w), d_out(n);
        d_out.poison();
        kernels::cuda::rms_norm({d_x.get(), with_residual ? d_res.get() : nullptr, d_w.get(),
                                 d_out.get(), rows, hidden, 1e-6f},
                                nullptr);
        *residual_out = d_res.download();
        auto out = d_out.download();
        out.resize(size_t(rows) * hidden);
        residual_out->resize(size_t(rows) * hidden);
        return out;
      };
      std::vector<bf16> res_all, res_few;
      const std::vector<bf16> all = run(kRows, &res_all);
      for (int rows : {1, 8}) {
        const std::vector<bf16> few = run(rows, &res_few);
        for (size_t i = 0; i < few.size(); ++i) {
          ASSERT_EQ(few[i].bits, all[i].bits) << "rows " << rows << " element " << i;
          ASSERT_EQ(res_few[i].bits, res_all[i].bits) << "rows " << rows << " residual " << i;
        }
      }
    }
}

// µs per fused add + RMSNorm in a CUDA graph of kChain norms, each reading the previous one's
// output (as a decode step chains them, PDL included), nothing else in between: the kernel's own
// cost at Llama-70B's hidden (8192) against Qwen3-30B's (2048). In Llama decode steps the norm
// costs ~5 µs after the GEMV before it, in Qwen3's 1.2 (bench/RESULTS.md 2026-12-02).
// --gtest_also_run_disabled_tests --gtest_filter='CudaRmsNormBench.*'
TEST(CudaRmsNormBench, DISABLED_Chain) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  constexpr int kChain = 100;
  for (int hidden : {2048, 4096, 8192})
    for (int rows : {1, 8}) {
      const size_t n = size_t(rows) * hidden;
      DeviceBuffer<bf16> a(random_bf16(n, 1, -1.0f, 1.0f)), b(random_bf16(n, 2, -1.0f, 1.0f));
      DeviceBuffer<bf16> res(random_bf16(n, 3, -1.0f, 1.0f));
      DeviceBuffer<bf16> w(random_bf16(hidden, 4, 0.5f, 1.5f));
      const double us = graph_us(
          [&](cudaStream_t s) {
            for (int i = 0; i < kChain; ++i) {
              bf16* in = i % 2 ? b.get() : a.get();
              bf16* out = i % 2 ? a.get() : b.get();
              kernels::cuda::rms_norm({in, res.get(), w.get(), out, rows, hidden, 1e-6f}, s);
            }
          },
          kChain);
      std::printf("rms_norm chain: hidden %5d rows %d: %.2f us per norm\n", hidden, rows, us);
    }
}

}  // namespace
}  // namespace serval::testing
