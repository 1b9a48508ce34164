// NVFP4 experts on both CUDA MoE backends vs moe_forward_cpu with the same quantized experts
// (random E2M1 codes, realistic e4m3 block scales, per-expert global scales that differ), the
// CUDA Backend's prepare_moe/moe on a padded shape, FP8 refusal, graph replay, a benchmark.
//
// Tolerance: rel L2 < 2e-2. The dequantized weights are exact in bf16 (e2m1·e4m3 has at most 6
// significant bits) and the products exact, so the fp32 sums differ only in order; as on the
// bf16 path the GPU rounds the SwiGLU activations, the expert outputs and the output to bf16
// (≤ 2⁻⁹ relative each) while the CPU keeps fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/moe/moe_cuda.h"
#include "kernels/cuda/moe/moe_gemm.h"
#include "kernels/cuda/moe/moe_nvfp4_repack.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_bench_util.h"
#include "kernels/moe_nvfp4_test_util.h"
#include "kernels/moe_test_util.h"

namespace serval::backend::moe {
namespace {

namespace mu = serval::testing::moe_util;
using mu::DeviceBuffer;
using mu::Rng;
using serval::testing::moe_util::HostStack;

constexpr double kTol = 2e-2;

using Shape = mu::MoeShape;
constexpr Shape kSmall = mu::kMoeSmall;
constexpr Shape kQwen = mu::kMoeQwen3;
using Call = mu::MoeCall;

using Layer = mu::Nvfp4Layer;

const char* name(MoeCudaBackend b) {
  return b == MoeCudaBackend::kLatency ? "nvfp4 latency" : "nvfp4 throughput";
}

// The call of T tokens (inputs seeded 311 + T) vs moe_forward_cpu (moe_test_util.h).
void check(Layer& l, int T, MoeCudaBackend b) {
  mu::expect_forward_matches_cpu(l, T, 311 + T, b, name(b), kTol);
}

constexpr MoeCudaBackend kBoth[] = {MoeCudaBackend::kLatency, MoeCudaBackend::kThroughput};
// 1..4 tokens take the latency backend's GEMV kernels (moe_gemv_nvfp4.h), more the grouped GEMMs.
constexpr int kTokenCounts[] = {1, 2, 3, 4, 8, 17, 64, 255, 1024};

class MoeNvfp4Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  }
  // The Qwen3-shape layer (302 MB of NVFP4 codes and scales): built once for the suite.
  static Layer& qwen() {
    static Layer l(kQwen, 0, kQwen.experts, 21);
    return l;
  }
};

TEST_F(MoeNvfp4Gpu, SmallShapeAllTokenCounts) {
  Layer l(kSmall, 0, kSmall.experts, 11);
  for (MoeCudaBackend b : kBoth)
    for (int T : kTokenCounts) check(l, T, b);
}

TEST_F(MoeNvfp4Gpu, QwenShapeAllTokenCounts) {
  for (MoeCudaBackend b : kBoth)
    for (int T : kTokenCounts) check(qwen(), T, b);
}

// NVFP4 experts: the latency backend keeps its kernels up to 63 tokens per expert (Qwen3: 1023
// tokens) and hands larger steps to the throughput kernels.
TEST_F(MoeNvfp4Gpu, LatencyLargeStepsRunThroughputKernels) {
  EXPECT_EQ(moe_latency_max_tokens_per_expert(true), 63);
  ASSERT_NO_FATAL_FAILURE(mu::expect_latency_step_runs(qwen(), 1023, 81, MoeCudaBackend::kLatency));
  ASSERT_NO_FATAL_FAILURE(
      mu::expect_latency_step_runs(qwen(), 1024, 82, MoeCudaBackend::kThroughput));
}

TEST_F(MoeNvfp4Gpu, LocalExpertSlice) {
  Layer mid(kSmall, 2, 4, 12);  // experts [2, 6) on this rank
  for (MoeCudaBackend b : kBoth)
    for (int T : {1, 2, 3, 4, 17, 255}) check(mid, T, b);
  Layer qslice(kQwen, 32, 32, 13);  // experts [32, 64) of the Qwen shape
  for (MoeCudaBackend b : kBoth)
    for (int T : {1, 2, 3, 4, 8, 255}) check(qslice, T, b);
}

TEST_F(MoeNvfp4Gpu, GraphReplayEqualsEager) {
  struct Case {
    int tokens;
    MoeCudaBackend backend;
  };
  for (Case k : {Case{1, MoeCudaBackend::kLatency}, Case{4, MoeCudaBackend::kLatency},
                 Case{8, MoeCudaBackend::kLatency}, Case{64, MoeCudaBackend::kLatency},
                 Case{17, MoeCudaBackend::kThroughput}}) {
    ASSERT_NO_FATAL_FAILURE(mu::expect_graph_replay_equals_eager(qwen(), k.tokens, 900 + k.tokens,
                                                                 k.backend, name(k.backend)));
  }
}

// The few-token GEMV kernels (what moe_forward_cuda runs at 1..4 tokens on the latency backend)
// against the grouped GEMMs + finalize on the same routing: the maps the routing kernel left in
// the workspace feed moe_grouped_gemm ×2 and moe_finalize into a second output. Both dequantize
// to the same exact bf16 weights and round act, each expert's output and the output to bf16, so
// only the fp32 summation order differs (MMA chains split over warps vs one chain): rare 1-ulp
// flips of a rounded value. Tolerance: rel L2 < 2e-3 (10× below the CPU comparison) and at least
// half of the outputs bit-identical (a missing or extra bf16 rounding perturbs most outputs by
// ~1e-3 relative, ≈ a quarter of a bf16 ulp, and breaks bit equality on far more than half).
TEST_F(MoeNvfp4Gpu, GemvMatchesGroupedGemm) {
  Layer small(kSmall, 0, kSmall.experts, 14);
  Layer mid(kSmall, 2, 4, 15);      // experts [2, 6): non-local choices, tokens with none
  Layer qslice(kQwen, 32, 32, 16);  // experts [32, 64) of the Qwen shape
  for (Layer* l : {&qwen(), &small, &mid, &qslice}) {
    for (int T = 1; T <= 4; ++T) {
      Call c(*l, T, 500 + T);
      const MoeCudaArgs a = c.args(*l, MoeCudaBackend::kLatency);
      const std::vector<uint16_t> gemv = [&] {
        c.run(a);
        return c.d_out.download<uint16_t>(size_t(T) * a.hidden);
      }();

      const MoeWorkspaceView ws = moe_workspace_view(a);
      namespace kc = serval::kernels::cuda;
      const MoeGroupedGemms g = moe_grouped_gemm_params(a, ws);  // on this call's routing maps
      DeviceBuffer out2(size_t(T) * a.hidden * 2);
      out2.poison();
      mu::cuda_ok(cudaDeviceSynchronize(), "poison");
      kc::moe_grouped_gemm(g.gemm1, nullptr);
      kc::moe_grouped_gemm(g.gemm2, nullptr);
      kc::moe_finalize(
          {ws.y, ws.expanded_to_permuted, ws.topk_weights, out2.as<bf16>(), T, a.top_k, a.hidden},
          nullptr);
      mu::cuda_ok(cudaDeviceSynchronize(), "grouped GEMM path");
      const std::vector<uint16_t> grouped = out2.download<uint16_t>(size_t(T) * a.hidden);

      std::vector<float> fa(gemv.size()), fb(grouped.size());
      size_t identical = 0;
      for (size_t i = 0; i < gemv.size(); ++i) {
        fa[i] = bf16_to_float(bf16{gemv[i]});
        fb[i] = bf16_to_float(bf16{grouped[i]});
        ASSERT_TRUE(std::isfinite(fa[i]) && std::isfinite(fb[i]))
            << "layer " << l->local_offset << "+" << l->num_local << " tokens " << T << " " << i;
        identical += gemv[i] == grouped[i];
      }
      const double err = mu::rel_l2(fa, fb);
      const double frac = double(identical) / double(gemv.size());
      std::printf("experts %d+%d/%d tokens %d: rel L2 %.2e, %.1f%% bit-identical\n",
                  l->local_offset, l->num_local, l->s.experts, T, err, 100.0 * frac);
      EXPECT_LT(err, 2e-3) << "experts " << l->local_offset << "+" << l->num_local << " tokens "
                           << T;
      EXPECT_GE(frac, 0.5) << "experts " << l->local_offset << "+" << l->num_local << " tokens "
                           << T;
    }
  }
}

// Routing inside the expert GEMVs (MoeCudaArgs::route_in_gemv: every CTA routes its token from the
// router logits with the routing kernels' device code) gives the output of the routing kernel +
// GEMVs bit for bit, for every routing method, with non-local choices and tokens without any.
TEST_F(MoeNvfp4Gpu, RoutingInGemvEqualsRoutingKernel) {
  Layer small(kSmall, 0, kSmall.experts, 24);
  Layer mid(kSmall, 2, 4, 25);
  Layer qslice(kQwen, 32, 32, 26);
  for (Layer* l : {&qwen(), &small, &mid, &qslice}) {
    for (kernels::RoutingMethod method :
         {kernels::RoutingMethod::kSoftmaxTopK, kernels::RoutingMethod::kTopKSoftmax}) {
      for (int T = 1; T <= 4; ++T) {
        Call c(*l, T, 700 + T);
        MoeCudaArgs a = c.args(*l, MoeCudaBackend::kLatency, method);
        ASSERT_TRUE(moe_runs_gemv(a));
        const std::vector<float> routed = c.run(a);
        a.route_in_gemv = true;
        c.d_ws.poison();  // the routing kernel's ids and weights must not be read
        const std::vector<float> in_gemv = c.run(a);
        ASSERT_EQ(routed.size(), in_gemv.size());
        for (size_t i = 0; i < routed.size(); ++i)
          ASSERT_EQ(routed[i], in_gemv[i]) << "experts " << l->local_offset << "+" << l->num_local
                                           << " tokens " << T << " " << i;
      }
    }
  }
  Call c(small, 8, 9);  // 8 tokens run the grouped GEMMs: routing in the GEMVs is refused
  MoeCudaArgs a = c.args(small, MoeCudaBackend::kLatency);
  a.route_in_gemv = true;
  EXPECT_THROW(moe_forward_cuda(a, nullptr), InvalidArgument);
}

// One Qwen3-30B-A3B layer with NVFP4 experts: 0.5625 bytes per weight (moe_bench_util.h).
TEST_F(MoeNvfp4Gpu, DISABLED_BenchmarkQwen3LayerNvfp4) {
  Layer& l = qwen();
  mu::benchmark_moe_layer("NVFP4 experts", 3.0 * l.s.hidden * l.s.inter * 0.5625, l);
}

}  // namespace
}  // namespace serval::backend::moe
