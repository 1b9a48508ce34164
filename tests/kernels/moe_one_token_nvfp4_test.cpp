// The one-token NVFP4 MoE block kernel (moe_one_token_nvfp4) against the three kernels it
// replaces: moe_norm_router_topk (logits only) then moe_gemv_nvfp4 routing in every CTA, on the
// same random inputs. The residual, x and the logits must be bit-identical (the same thread →
// column assignment and fp32 summation order), hence the same routing; the output within rel L2
// 2e-3 with at least half of it bit-identical: gate_up's K partials are added in another fp32
// order, so an activation may round to the neighbouring bf16 (the down stage is the same
// arithmetic). Both paths are checked against moe_forward_cpu by the tests of their kernels.
// Also: launches back to back without a sync (the grid barriers' counters reset), graph replays
// equal the eager run, and the shapes it refuses.
#include "kernels/cuda/moe/moe_one_token_nvfp4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/moe/moe_cpu.h"
#include "backend/moe/moe_cuda.h"
#include "kernels/bench_timing.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_nvfp4_test_util.h"
#include "kernels/moe_test_util.h"

namespace serval::kernels::cuda {
namespace {

namespace mu = serval::testing::moe_util;
using backend::moe::MoeCudaBackend;
using mu::DeviceBuffer;
using mu::Nvfp4Layer;
using mu::Rng;

constexpr float kEps = 1e-6f;

// One token's inputs and outputs on the device, and the parameters of both paths.
struct Case {
  const Nvfp4Layer& l;
  std::vector<bf16> h, residual, norm_w, router;
  DeviceBuffer d_h, d_residual0, d_residual, d_norm_w, d_router;
  mu::MoeCall call;  // x, logits, out and the workspace
  MoeNormRouterParams norm_router{};
  MoeGemvNvfp4Params gemv{};

  Case(const Nvfp4Layer& layer, RoutingMethod method, uint64_t seed)
      : l(layer),
        h(random_row(layer.s.hidden, 1.0f, seed)),
        residual(random_row(layer.s.hidden, 2.0f, seed + 1)),
        norm_w(norm_weight(layer.s.hidden, seed + 2)),
        router(to_bf16(layer.router)),
        d_h(h),
        d_residual0(residual),
        d_residual(residual),
        d_norm_w(norm_w),
        d_router(router),
        call(layer, 1, seed + 3) {
    const backend::moe::MoeCudaArgs a = call.args(layer, MoeCudaBackend::kLatency, method);
    const backend::moe::MoeWorkspaceView ws = backend::moe::moe_workspace_view(a);
    MoeNormRouterParams& p = norm_router;
    p.h = d_h.as<bf16>();
    p.residual = d_residual.as<bf16>();
    p.norm_weight = d_norm_w.as<bf16>();
    p.router = d_router.as<bf16>();
    p.x = call.d_x.as<bf16>();
    p.logits = call.d_logits.as<float>();
    p.hidden = layer.s.hidden;
    p.eps = kEps;
    p.logits_only = true;
    p.routing.num_tokens = 1;
    p.routing.num_experts = layer.s.experts;
    p.routing.top_k = layer.s.top_k;
    p.routing.method = method;
    p.routing.renormalize = true;
    p.routing.local_offset = layer.local_offset;
    p.routing.num_local = layer.num_local;
    p.routing.tile = ws.tile;
    p.routing.topk_ids = ws.topk_ids;
    p.routing.topk_weights = ws.topk_weights;
    p.routing.expanded_to_permuted = ws.expanded_to_permuted;
    p.routing.permuted_to_token = ws.permuted_to_token;
    p.routing.tile_expert = ws.tile_expert;
    p.routing.num_tiles = ws.num_tiles;
    gemv = backend::moe::moe_gemv_params(a, ws);
  }

  MoeOneTokenNvfp4Params fused() const { return {norm_router, gemv}; }

  // The three-kernel path on the default stream.
  void run_unfused() {
    reset_residual(nullptr);
    moe_norm_router_topk(norm_router, nullptr);
    const MoeGemvRouting route{norm_router.logits, norm_router.routing};
    moe_gemv_nvfp4(gemv, nullptr, &route);
    mu::cuda_ok(cudaDeviceSynchronize(), "three kernels");
  }

  void reset_residual(cudaStream_t stream) {
    mu::cuda_ok(cudaMemcpyAsync(d_residual.as<void>(), d_residual0.as<void>(), d_residual.bytes(),
                                cudaMemcpyDeviceToDevice, stream),
                "reset residual");
  }

  void poison_outputs() {
    call.d_x.poison();
    call.d_logits.poison();
    call.d_out.poison();
    call.d_ws.poison();
  }

  struct Outputs {
    std::vector<uint16_t> residual, x, out;
    std::vector<uint32_t> logits;
  };
  Outputs outputs() const {
    const size_t H = size_t(l.s.hidden);
    return {d_residual.download<uint16_t>(H), call.d_x.download<uint16_t>(H),
            call.d_out.download<uint16_t>(H), call.d_logits.download<uint32_t>(l.s.experts)};
  }

 private:
  static std::vector<bf16> random_row(int n, float scale, uint64_t seed) {
    Rng r(seed);
    return mu::random_bf16(size_t(n), scale, r);
  }
  static std::vector<bf16> norm_weight(int n, uint64_t seed) {
    Rng r(seed);
    std::vector<bf16> w(static_cast<size_t>(n));
    for (auto& v : w) v = float_to_bf16(1.0f + 0.5f * r.uniform());
    return w;
  }
  static std::vector<bf16> to_bf16(const std::vector<float>& f) {
    std::vector<bf16> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
    return b;
  }
};

void expect_same_bits(const Case::Outputs& got, const Case::Outputs& want) {
  EXPECT_EQ(got.residual, want.residual);
  EXPECT_EQ(got.x, want.x);
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.out, want.out);
}

class MoeOneTokenNvfp4 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  }
};

TEST_F(MoeOneTokenNvfp4, MatchesThreeKernels) {
  Nvfp4Layer qwen(mu::kMoeQwen3, 0, mu::kMoeQwen3.experts, 41);
  Nvfp4Layer qslice(mu::kMoeQwen3, 32, 32, 42);  // experts [32, 64): some choices elsewhere
  Nvfp4Layer small(mu::kMoeSmall, 0, mu::kMoeSmall.experts, 43);
  Nvfp4Layer mid(mu::kMoeSmall, 2, 4, 44);  // experts [2, 6)
  int seed = 0;
  for (const Nvfp4Layer* l : {&qwen, &qslice, &small, &mid}) {
    for (RoutingMethod method : {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax}) {
      for (int rep = 0; rep < 3; ++rep) {
        SCOPED_TRACE(::testing::Message()
                     << "experts " << l->local_offset << "+" << l->num_local << "/" << l->s.experts
                     << ", method " << int(method) << ", case " << rep);
        Case c(*l, method, 900 + uint64_t(seed++) * 10);
        ASSERT_TRUE(moe_one_token_nvfp4_supported(c.fused()));
        c.poison_outputs();
        c.run_unfused();
        const Case::Outputs want = c.outputs();

        c.poison_outputs();
        c.reset_residual(nullptr);
        moe_one_token_nvfp4(c.fused(), nullptr);
        mu::cuda_ok(cudaDeviceSynchronize(), "fused");
        const Case::Outputs got = c.outputs();
        EXPECT_EQ(got.residual, want.residual);
        EXPECT_EQ(got.x, want.x);
        ASSERT_EQ(got.logits, want.logits);

        std::vector<float> fa(got.out.size()), fb(want.out.size());
        size_t identical = 0;
        for (size_t i = 0; i < fa.size(); ++i) {
          fa[i] = bf16_to_float(bf16{got.out[i]});
          fb[i] = bf16_to_float(bf16{want.out[i]});
          ASSERT_TRUE(std::isfinite(fa[i]) && std::isfinite(fb[i])) << "row element " << i;
          identical += got.out[i] == want.out[i];
        }
        const double err = mu::rel_l2(fa, fb);
        const double frac = double(identical) / double(fa.size());
        // Both against moe_forward_cpu on the normed row (its own fp32 logits: a near-tie could
        // route differently, so this is only reported).
        std::vector<float> x(fa.size()), ref(fa.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(bf16{got.x[i]});
        backend::moe::moe_forward_cpu(x.data(), 1, l->cpu_weights(method), ref.data());
        std::printf(
            "experts %d+%d/%d method %d: rel L2 %.2e, %.1f%% bit-identical; vs CPU: fused %.2e, "
            "three kernels %.2e\n",
            l->local_offset, l->num_local, l->s.experts, int(method), err, 100.0 * frac,
            mu::rel_l2(fa, ref), mu::rel_l2(fb, ref));
        if (err >= 2e-3) {  // which 16-row strips differ, and the routing's local choices
          std::string strips;
          for (size_t hs = 0; hs * 16 < fa.size(); ++hs) {
            std::vector<float> a(fa.begin() + long(hs) * 16, fa.begin() + long(hs) * 16 + 16);
            std::vector<float> b(fb.begin() + long(hs) * 16, fb.begin() + long(hs) * 16 + 16);
            strips += mu::rel_l2(a, b) < 2e-2 ? '.' : 'X';
          }
          std::printf(
              "  strips differing: %s\n  out[0..3] fused %g %g %g %g, three %g %g %g %g, "
              "cpu %g %g %g %g\n",
              strips.c_str(), fa[0], fa[1], fa[2], fa[3], fb[0], fb[1], fb[2], fb[3], ref[0],
              ref[1], ref[2], ref[3]);
        }
        EXPECT_LT(err, 2e-3);
        EXPECT_GE(frac, 0.5);
      }
    }
  }
}

// Launches back to back on one stream without a sync, then graph replays: each equals the first
// eager launch bit for bit (the counters are back at zero after every launch; no data race).
TEST_F(MoeOneTokenNvfp4, BackToBackAndGraphReplay) {
  Nvfp4Layer qwen(mu::kMoeQwen3, 0, mu::kMoeQwen3.experts, 51);
  Case c(qwen, RoutingMethod::kSoftmaxTopK, 5);
  c.reset_residual(nullptr);
  moe_one_token_nvfp4(c.fused(), nullptr);
  const Case::Outputs want = c.outputs();

  cudaStream_t stream;
  mu::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  auto enqueue = [&](cudaStream_t s) {
    for (int i = 0; i < 4; ++i) {
      c.reset_residual(s);
      moe_one_token_nvfp4(c.fused(), s);
    }
  };
  for (int round = 0; round < 3; ++round) {
    c.poison_outputs();
    enqueue(stream);
    mu::cuda_ok(cudaStreamSynchronize(stream), "back to back");
    SCOPED_TRACE(::testing::Message() << "eager round " << round);
    expect_same_bits(c.outputs(), want);
  }
  const serval::testing::CapturedGraph graph(stream, enqueue);
  for (int replay = 0; replay < 3; ++replay) {
    c.poison_outputs();
    graph.launch(stream);
    mu::cuda_ok(cudaStreamSynchronize(stream), "replay");
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    expect_same_bits(c.outputs(), want);
  }
  cudaStreamDestroy(stream);
}

TEST_F(MoeOneTokenNvfp4, RefusesOtherShapes) {
  Nvfp4Layer small(mu::kMoeSmall, 0, mu::kMoeSmall.experts, 61);
  Case c(small, RoutingMethod::kSoftmaxTopK, 6);
  MoeOneTokenNvfp4Params p = c.fused();
  ASSERT_TRUE(moe_one_token_nvfp4_supported(p));
  MoeOneTokenNvfp4Params two = p;  // two tokens
  two.norm_router.routing.num_tokens = two.experts.num_tokens = 2;
  MoeOneTokenNvfp4Params wide = p;  // hidden 4096: 256 down strips, one CTA each
  wide.norm_router.hidden = wide.experts.hidden = 4096;
  MoeOneTokenNvfp4Params odd = p;  // inter not a multiple of 64
  odd.experts.inter = 96;
  MoeOneTokenNvfp4Params topk = p;  // top-k of the routing and the experts differ
  topk.experts.top_k = 1;
  for (const MoeOneTokenNvfp4Params* bad : {&two, &wide, &odd, &topk}) {
    EXPECT_FALSE(moe_one_token_nvfp4_supported(*bad));
    EXPECT_THROW(moe_one_token_nvfp4(*bad, nullptr), InvalidArgument);
  }
  p.experts.act = nullptr;
  EXPECT_THROW(moe_one_token_nvfp4(p, nullptr), InvalidArgument);
}

// µs per one-token MoE block, Qwen3-30B-A3B shape: the fused kernel vs the three kernels
// (norm + router with logits only, gate_up with routing, down), 8 token rows with different
// experts in turn (8 × ~21 MB of expert weights: mostly past L2, as in a model's layers), 64
// blocks in one CUDA graph, median of 20 replays; then where the fused kernel's time goes.
TEST_F(MoeOneTokenNvfp4, DISABLED_BenchFusedVsThreeKernels) {
  Nvfp4Layer qwen(mu::kMoeQwen3, 0, mu::kMoeQwen3.experts, 71);
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 8; ++i)
    cases.push_back(std::make_unique<Case>(qwen, RoutingMethod::kSoftmaxTopK, 7000 + 10 * i));
  constexpr int kBlocks = 64;
  const double three = serval::testing::graph_us(
      [&](cudaStream_t st) {
        for (int i = 0; i < kBlocks; ++i) {
          Case& c = *cases[size_t(i % 8)];
          moe_norm_router_topk(c.norm_router, st);
          const MoeGemvRouting route{c.norm_router.logits, c.norm_router.routing};
          moe_gemv_nvfp4(c.gemv, st, &route);
        }
      },
      kBlocks);
  const double fused = serval::testing::graph_us(
      [&](cudaStream_t st) {
        for (int i = 0; i < kBlocks; ++i) moe_one_token_nvfp4(cases[size_t(i % 8)]->fused(), st);
      },
      kBlocks);
  std::printf("one-token MoE block, Qwen3-30B-A3B NVFP4: three kernels %.2f us, fused %.2f us\n",
              three, fused);

  // Per launch, each phase's first and last CTA (ns after the first CTA started), medians over
  // the launches of a graph replay; and the gap from a launch's end to the next one's start.
  const int G = moe_one_token_nvfp4_ctas(cases[0]->fused());
  const size_t per_launch = size_t(G) * kMoeOneTokenPhases;
  DeviceBuffer stamps(kBlocks * per_launch * sizeof(unsigned long long));
  serval::testing::graph_us(
      [&](cudaStream_t st) {
        for (int i = 0; i < kBlocks; ++i) {
          MoeOneTokenNvfp4Params q = cases[size_t(i % 8)]->fused();
          q.phase_ns = stamps.as<unsigned long long>() + size_t(i) * per_launch;
          moe_one_token_nvfp4(q, st);
        }
      },
      kBlocks, 3);
  const auto t = stamps.download<unsigned long long>(kBlocks * per_launch);
  std::vector<std::vector<double>> last(kMoeOneTokenPhases), first(kMoeOneTokenPhases);
  std::vector<double> gaps;
  auto at = [&](int launch, int cta, int k) {
    return t[size_t(launch) * per_launch + size_t(cta) * kMoeOneTokenPhases + size_t(k)];
  };
  for (int i = 0; i < kBlocks; ++i) {
    unsigned long long start = ~0ull;
    for (int c = 0; c < G; ++c) start = std::min(start, at(i, c, 0));
    for (int k = 0; k < kMoeOneTokenPhases; ++k) {
      unsigned long long hi = 0, lo = ~0ull;
      for (int c = 0; c < G; ++c) {
        hi = std::max(hi, at(i, c, k));
        lo = std::min(lo, at(i, c, k));
      }
      last[size_t(k)].push_back(double(hi - start));
      first[size_t(k)].push_back(double(lo - start));
    }
    if (i + 1 < kBlocks) {
      unsigned long long end = 0, next = ~0ull;
      for (int c = 0; c < G; ++c) {
        end = std::max(end, at(i, c, kMoeOneTokenPhases - 1));
        next = std::min(next, at(i + 1, c, 0));
      }
      gaps.push_back(double(int64_t(next - end)));
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const char* names[kMoeOneTokenPhases] = {"start",   "pdl wait",  "barrier 1", "routed",
                                           "gate_up", "barrier 2", "end"};
  std::printf("phase: ns after the launch's first CTA start, first CTA / last CTA (median of %d)\n",
              kBlocks);
  for (int k = 0; k < kMoeOneTokenPhases; ++k)
    std::printf("  %-10s %8.0f %8.0f\n", names[k], median(first[size_t(k)]),
                median(last[size_t(k)]));
  std::printf("  last CTA's end to the next launch's first start: %.0f ns\n", median(gaps));
}

}  // namespace
}  // namespace serval::kernels::cuda
