// Both CUDA MoE backends vs moe_forward_cpu on the same bf16-rounded inputs, CUDA graph replay
// of the latency path, and a DISABLED_ benchmark.
//
// Tolerance: rel L2 < 2e-2. The GPU rounds the SwiGLU activations and the expert outputs to
// bf16 (relative error ≤ 2⁻⁹ each) and the output to bf16; the CPU keeps fp32 throughout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backend/moe/moe_cuda.h"
#include "kernels/cuda/moe/moe_gemm.h"
#include "kernels/cuda/moe/moe_routing.h"
#include "kernels/cuda/norm_rope/rms_norm.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_bench_util.h"
#include "kernels/moe_test_util.h"

namespace serval::backend::moe {
namespace {

namespace mu = serval::testing::moe_util;
using mu::DeviceBuffer;
using mu::Rng;

constexpr double kTol = 2e-2;

using Shape = mu::MoeShape;
constexpr Shape kSmall = mu::kMoeSmall;  // Mixtral-like, scaled down
constexpr Shape kQwen = mu::kMoeQwen3;   // Qwen3-30B-A3B layer
using Call = mu::MoeCall;

// One layer with bf16 experts on host and device; router rows random or all zero (ties).
struct Layer : mu::MoeTestLayer {
  std::vector<bf16> gate_up, down;  // [local, 2·inter, hidden], [local, hidden, inter]
  std::unique_ptr<DeviceBuffer> d_gate_up, d_down;

  Layer(Shape shape, int offset, int local, bool zero_router, uint64_t seed)
      : MoeTestLayer(shape, offset, local) {
    Rng rng(seed);
    gate_up = mu::random_bf16(size_t(local) * 2 * s.inter * s.hidden,
                              1.0f / std::sqrt(float(s.hidden)), rng);
    down =
        mu::random_bf16(size_t(local) * s.hidden * s.inter, 1.0f / std::sqrt(float(s.inter)), rng);
    router = mu::random_router(s, rng, zero_router);
    d_gate_up = std::make_unique<DeviceBuffer>(gate_up);
    d_down = std::make_unique<DeviceBuffer>(down);
  }

  void set_cpu_experts(MoeWeights& w) const override {
    w.gate_up =
        host_view(gate_up.data(), DType::kBF16, {num_local, 2 * s.inter, s.hidden}, nullptr);
    w.down = host_view(down.data(), DType::kBF16, {num_local, s.hidden, s.inter}, nullptr);
  }
  void set_cuda_experts(MoeCudaArgs& a) const override {
    a.gate_up = d_gate_up->as<bf16>();
    a.down = d_down->as<bf16>();
  }
};

const char* name(MoeCudaBackend b) {
  return b == MoeCudaBackend::kLatency ? "latency" : "throughput";
}

// The call of T tokens (inputs seeded 77 + T) vs moe_forward_cpu (moe_test_util.h).
void check(Layer& l, int T, MoeCudaBackend b,
           kernels::RoutingMethod method = kernels::RoutingMethod::kSoftmaxTopK,
           bool renormalize = true) {
  mu::expect_forward_matches_cpu(l, T, 77 + T, b, name(b), kTol, method, renormalize);
}

constexpr MoeCudaBackend kBoth[] = {MoeCudaBackend::kLatency, MoeCudaBackend::kThroughput};

class MoeForwardGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  }
  // The Qwen3-shape layer is 1.2 GB of bf16: built once for the whole suite.
  static Layer& qwen() {
    static Layer l(kQwen, 0, kQwen.experts, false, 5);
    return l;
  }
};

TEST_F(MoeForwardGpu, SmallShapeAllTokenCounts) {
  Layer l(kSmall, 0, kSmall.experts, false, 1);
  for (MoeCudaBackend b : kBoth)
    for (int T : {1, 2, 3, 8, 17, 40, 64, 81, 120, 255, 1024, 8192}) check(l, T, b);
}

TEST_F(MoeForwardGpu, QwenShapeLatency) {
  // Covers every latency token tile: 8 (≤ 16·… tokens), 16, 32, 64.
  for (int T : {1, 2, 3, 8, 17, 64, 200, 255, 300, 1024})
    check(qwen(), T, MoeCudaBackend::kLatency);
}

TEST_F(MoeForwardGpu, QwenShapeThroughput) {
  for (int T : {1, 17, 255, 1024}) check(qwen(), T, MoeCudaBackend::kThroughput);
}

TEST_F(MoeForwardGpu, QwenShape8192Tokens) {
  for (MoeCudaBackend b : kBoth) check(qwen(), 8192, b);
}

// bf16 experts: the latency backend hands steps of more than 31 tokens per expert to the
// throughput kernels (Qwen3: 512 tokens = 32 per expert; Mixtral-like: 128 tokens).
TEST_F(MoeForwardGpu, LatencyLargeStepsRunThroughputKernels) {
  EXPECT_EQ(moe_latency_max_tokens_per_expert(false), 31);
  ASSERT_NO_FATAL_FAILURE(mu::expect_latency_step_runs(qwen(), 511, 77, MoeCudaBackend::kLatency));
  ASSERT_NO_FATAL_FAILURE(
      mu::expect_latency_step_runs(qwen(), 512, 78, MoeCudaBackend::kThroughput));
  Layer small(kSmall, 0, kSmall.experts, false, 7);
  ASSERT_NO_FATAL_FAILURE(mu::expect_latency_step_runs(small, 127, 79, MoeCudaBackend::kLatency));
  ASSERT_NO_FATAL_FAILURE(
      mu::expect_latency_step_runs(small, 128, 80, MoeCudaBackend::kThroughput));
}

TEST_F(MoeForwardGpu, RoutingMethods) {
  Layer l(kSmall, 0, kSmall.experts, false, 2);
  for (MoeCudaBackend b : kBoth) {
    check(l, 17, b, kernels::RoutingMethod::kSoftmaxTopK, false);
    check(l, 17, b, kernels::RoutingMethod::kTopKSoftmax, false);
    check(l, 17, b, kernels::RoutingMethod::kSigmoidGroupedTopK, true);
  }
}

TEST_F(MoeForwardGpu, AllTokensToTheSameExperts) {
  // Zero router → all logits tie → every token picks experts 0..k-1 (the others stay empty).
  Layer small(kSmall, 0, kSmall.experts, true, 3);
  for (MoeCudaBackend b : kBoth)
    for (int T : {1, 64, 255, 1024}) check(small, T, b);
  Layer big(kQwen, 0, 16, true, 4);  // slice of the first 16 experts keeps it small
  for (MoeCudaBackend b : kBoth)
    for (int T : {3, 255}) check(big, T, b);
}

TEST_F(MoeForwardGpu, LocalExpertSlice) {
  Layer mid(kSmall, 2, 4, false, 6);  // experts [2, 6) on this rank
  for (MoeCudaBackend b : kBoth)
    for (int T : {1, 17, 255}) check(mid, T, b);
  Layer tail(kSmall, 4, 4, true, 7);  // ties pick experts 0, 1: nothing local, output zero
  for (MoeCudaBackend b : kBoth) check(tail, 33, b);
}

TEST_F(MoeForwardGpu, LatencyGraphReplayIsBitIdentical) {
  for (int T : {1, 8, 64})
    ASSERT_NO_FATAL_FAILURE(mu::expect_graph_replay_equals_eager(
        qwen(), T, 900 + T, MoeCudaBackend::kLatency, name(MoeCudaBackend::kLatency)));
}

// The latency GEMMs at token tile 8 pick 128-, 64- or 32-row weight tiles from the grid size
// (moe_gemm_block_rows). The token counts the correctness tests above run must reach all three
// for both GEMMs, so that every instantiation is checked against the CPU.
TEST_F(MoeForwardGpu, LatencyWeightTilesAllCovered) {
  struct Use {
    Shape s;
    int num_local;
    std::vector<int> tokens;
  };
  const Use uses[] = {{kSmall, kSmall.experts, {1, 2, 3, 8, 17, 40, 64, 81, 120}},
                      {kQwen, kQwen.experts, {1, 2, 3, 8, 17, 64}},
                      {kQwen, 16, {3, 255}}};
  std::map<int, int> seen[2];  // [gemm2][block rows] → count
  for (const Use& u : uses)
    for (int T : u.tokens) {
      const int tile = moe_latency_tile(T, u.s.top_k, u.num_local);
      kernels::cuda::MoeGemmParams p{};
      p.config = kernels::cuda::MoeGemmConfig::kLatency;
      p.tile = tile;
      p.max_tiles = kernels::cuda::moe_max_tiles(T * u.s.top_k, u.num_local, tile);
      for (int g = 0; g < 2; ++g) {
        p.gemm1 = g == 0;
        p.n_out = p.gemm1 ? u.s.inter : u.s.hidden;
        const int bm = kernels::cuda::moe_gemm_block_rows(p);
        ASSERT_TRUE(bm == 32 || bm == 64 || bm == 128) << bm;
        if (tile != 8) {
          EXPECT_EQ(bm, 128) << "tokens " << T;
        }
        ++seen[g][bm];
      }
    }
  for (int g = 0; g < 2; ++g)
    for (int bm : {32, 64, 128})
      EXPECT_GT(seen[g][bm], 0) << "GEMM" << g + 1 << " never uses " << bm << "-row tiles";
}

// Two layers back to back on one stream, the second reading the first's output and reusing its
// workspace, with no host synchronisation in between (eager and in one graph): the kernels chained
// by programmatic dependent launch must not run ahead of the previous layer. Compared bit for
// bit with the same two layers run with a device synchronisation after each.
TEST_F(MoeForwardGpu, BackToBackLayersMatchSynchronized) {
  for (int T : {1, 2, 8, 64}) {
    Call c(qwen(), T, 1300 + T);
    const MoeCudaArgs a1 = c.args(qwen(), MoeCudaBackend::kLatency);
    DeviceBuffer out2(size_t(T) * a1.hidden * 2);
    MoeCudaArgs a2 = a1;
    a2.x = a1.out;
    a2.out = out2.as<bf16>();
    const size_t n = size_t(T) * a1.hidden;

    c.d_out.poison();
    out2.poison();
    moe_forward_cuda(a1, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    moe_forward_cuda(a2, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto ref1 = c.d_out.download<uint16_t>(n), ref2 = out2.download<uint16_t>(n);

    const mu::Stream stream;
    auto both = [&](cudaStream_t s) {
      moe_forward_cuda(a1, s);
      moe_forward_cuda(a2, s);
    };
    // Three runs of `launch` on `stream`, outputs and workspace poisoned before each.
    auto expect_reference = [&](const char* how, const std::function<void()>& launch) {
      for (int rep = 0; rep < 3; ++rep) {
        c.d_out.poison();
        out2.poison();
        c.d_ws.poison();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // poison done before `stream` runs
        launch();
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        EXPECT_EQ(c.d_out.download<uint16_t>(n), ref1) << how << " layer 1, tokens " << T;
        EXPECT_EQ(out2.download<uint16_t>(n), ref2) << how << " layer 2, tokens " << T;
      }
    };
    ASSERT_NO_FATAL_FAILURE(expect_reference("eager", [&] { both(stream.get()); }));
    const serval::testing::CapturedGraph graph(stream.get(), both);
    ASSERT_NO_FATAL_FAILURE(expect_reference("graph", [&] { graph.launch(stream.get()); }));
  }
}

// moe_finalize alone vs the same fp32 arithmetic on the CPU: for each column, acc = fma(w_j, y,
// acc) over the choices j = 0 … top_k − 1 in order, skipping −1 rows, then bf16 round to nearest
// even (the kernel's `acc += w · y` compiles to that FMA chain). Bit-exact. About one choice in
// five is −1; weights of either sign.
void check_finalize(int T, int k, int hidden) {
  SCOPED_TRACE(::testing::Message()
               << "finalize tokens " << T << ", top_k " << k << ", hidden " << hidden);
  Rng rng(uint64_t(T) * 1009 + k * 31 + hidden);
  const int rows = T * k + 5;
  const std::vector<bf16> y = mu::random_bf16(size_t(rows) * hidden, 2.0f, rng);
  std::vector<int32_t> e2p(size_t(T) * k);
  std::vector<float> w(e2p.size());
  for (size_t i = 0; i < e2p.size(); ++i) {
    e2p[i] = rng.next() % 5 == 0 ? -1 : int32_t(rng.next() % uint32_t(rows));
    w[i] = rng.uniform();
  }
  std::vector<uint16_t> ref(size_t(T) * hidden);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < hidden; ++h) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) {
        const int32_t row = e2p[size_t(t) * k + j];
        if (row < 0) continue;
        acc = std::fma(w[size_t(t) * k + j], bf16_to_float(y[size_t(row) * hidden + h]), acc);
      }
      ref[size_t(t) * hidden + h] = float_to_bf16(acc).bits;
    }
  DeviceBuffer d_y(y), d_e2p(e2p), d_w(w), d_out(size_t(T) * hidden * 2);
  d_out.poison();
  kernels::cuda::moe_finalize(
      {d_y.as<bf16>(), d_e2p.as<int32_t>(), d_w.as<float>(), d_out.as<bf16>(), T, k, hidden},
      nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = d_out.download<uint16_t>(size_t(T) * hidden);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], ref[i]) << "token " << i / hidden << ", column " << i % hidden;
}

TEST_F(MoeForwardGpu, FinalizeBitExact) {
  for (int T : {1, 2, 8, 33, 300}) check_finalize(T, 8, 2048);  // Qwen3-30B-A3B
  check_finalize(3, 1, 256);    // one choice; 32 column chunks: half the threads idle
  check_finalize(5, 3, 520);    // 65 chunks: a second slice with one chunk
  check_finalize(4, 12, 1024);  // a second group of choices, partly filled
  check_finalize(2, 32, 2048);  // four full groups
  check_finalize(17, 2, 8);     // one chunk per token
}

// moe_finalize with the next add + RMSNorm fused in vs moe_finalize then rms_norm with a residual
// on the same random inputs: the updated residual and the normed rows bit-identical (the fused
// kernel repeats rms_norm's arithmetic in its CTA shape). About one choice in five is −1.
void check_finalize_norm(int T, int k, int hidden) {
  SCOPED_TRACE(::testing::Message()
               << "finalize + norm, tokens " << T << ", top_k " << k << ", hidden " << hidden);
  Rng rng(uint64_t(T) * 7919 + k * 131 + hidden);
  const int rows = T * k + 3;
  const size_t n = size_t(T) * hidden;
  const std::vector<bf16> y = mu::random_bf16(size_t(rows) * hidden, 2.0f, rng);
  const std::vector<bf16> residual = mu::random_bf16(n, 4.0f, rng);
  const std::vector<bf16> weight = mu::random_bf16(size_t(hidden), 1.5f, rng);
  std::vector<int32_t> e2p(size_t(T) * k);
  std::vector<float> w(e2p.size());
  for (size_t i = 0; i < e2p.size(); ++i) {
    e2p[i] = rng.next() % 5 == 0 ? -1 : int32_t(rng.next() % uint32_t(rows));
    w[i] = rng.uniform();
  }
  constexpr float kEps = 1e-6f;
  DeviceBuffer d_y(y), d_e2p(e2p), d_w(w), d_weight(weight);
  // Reference: finalize into out, then rms_norm(out, residual) into x.
  DeviceBuffer d_out(n * 2), d_res_ref(residual), d_x_ref(n * 2);
  d_out.poison();
  d_x_ref.poison();
  kernels::cuda::moe_finalize(
      {d_y.as<bf16>(), d_e2p.as<int32_t>(), d_w.as<float>(), d_out.as<bf16>(), T, k, hidden},
      nullptr);
  kernels::cuda::rms_norm({d_out.as<bf16>(), d_res_ref.as<bf16>(), d_weight.as<bf16>(),
                           d_x_ref.as<bf16>(), T, hidden, kEps},
                          nullptr);
  // Fused: out must stay untouched.
  DeviceBuffer d_out2(n * 2), d_res(residual), d_x(n * 2);
  d_out2.poison();
  d_x.poison();
  kernels::cuda::MoeFinalizeParams p{
      d_y.as<bf16>(), d_e2p.as<int32_t>(), d_w.as<float>(), d_out2.as<bf16>(), T, k, hidden};
  p.next = {d_res.as<bf16>(), d_weight.as<bf16>(), d_x.as<bf16>(), kEps};
  kernels::cuda::moe_finalize(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_res.download<uint16_t>(n), d_res_ref.download<uint16_t>(n)) << "residual";
  EXPECT_EQ(d_x.download<uint16_t>(n), d_x_ref.download<uint16_t>(n)) << "normed rows";
  const auto untouched = d_out2.download<uint16_t>(n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(untouched[i], 0xFFFFu) << "out written at " << i;
}

TEST_F(MoeForwardGpu, FinalizeNormEqualsFinalizeThenRmsNorm) {
  for (int T : {1, 3, 8, 40}) check_finalize_norm(T, 8, 2048);  // Qwen3-30B-A3B: 256 threads
  check_finalize_norm(2, 8, 4096);                              // two chunks per thread
  check_finalize_norm(3, 8, 7168);   // DeepSeek-V3 width: up to four chunks, the last partial
  check_finalize_norm(5, 12, 520);   // 65 chunks → 96 threads; a second group of choices
  check_finalize_norm(4, 1, 64);     // one warp, one choice
  check_finalize_norm(2, 32, 1024);  // four full groups
}

TEST_F(MoeForwardGpu, FinalizeNormRejectsWideRows) {
  DeviceBuffer d(size_t(64));
  kernels::cuda::MoeFinalizeParams p{nullptr, nullptr, nullptr, nullptr, 1, 8, 8192 + 8};
  p.next = {d.as<bf16>(), d.as<bf16>(), d.as<bf16>(), 0.0f};
  EXPECT_THROW(kernels::cuda::moe_finalize(p, nullptr), InvalidArgument);
}

// One Qwen3-30B-A3B layer with bf16 experts (moe_bench_util.h).
TEST_F(MoeForwardGpu, DISABLED_BenchmarkQwen3Layer) {
  Layer& l = qwen();
  mu::benchmark_moe_layer("bf16 experts", 3.0 * l.s.hidden * l.s.inter * 2, l);
}

}  // namespace
}  // namespace serval::backend::moe
