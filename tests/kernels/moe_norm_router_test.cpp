// The fused residual add + RMSNorm + router GEMV + routing kernel (moe_norm_router_topk) against
// the unfused sequence: kernels::cuda::rms_norm (residual and normed rows bit-identical), router
// logits in double on the host from rms_norm's rows (fp32 summation-order tolerance), and
// kernels::cuda::moe_routing (run on the fused kernel's own logits: every output bit-identical;
// run on the host logits: ids and maps identical, weights within 1e-5). The test data is drawn
// (fixed seeds, retried in a fixed sequence) so that no token has two of its top k + 1 logits
// within 1e-3 of the logits' standard deviation: summation order cannot change the choice.
// Also: back-to-back launches without a sync (the arrival counters reset), graph replays equal
// the eager run, and a DISABLED_ benchmark of fused vs unfused in a CUDA graph.
#include "kernels/cuda/moe/moe_norm_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "backend/cuda/gemm_cublaslt.h"
#include "backend/moe/moe_cuda.h"
#include "kernels/bench_timing.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/moe/moe_routing.h"
#include "kernels/cuda/norm_rope/rms_norm.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_test_util.h"

namespace serval::kernels::cuda {
namespace {

using serval::testing::graph_us;
using serval::testing::moe_util::cuda_ok;
using serval::testing::moe_util::DeviceBuffer;
using serval::testing::moe_util::Rng;

constexpr float kEps = 1e-6f;

struct Shape {
  int tokens, experts, top_k, hidden;
  int local_offset = 0, num_local = -1;  // −1: all experts local
  int locals() const { return num_local < 0 ? experts : num_local; }
  int tile() const { return backend::moe::moe_latency_tile(tokens, top_k, locals()); }
  int max_tiles() const { return moe_max_tiles(tokens * top_k, locals(), tile()); }
};

struct HostData {
  std::vector<bf16> h, residual, norm_w, router;
};

// Host model of the fused math in double (x rounded to bf16 as the kernel stores it): the logits
// and, per logit, Σ|x_i·w_i| (the scale of fp32 summation error).
void host_logits(const HostData& d, const Shape& s, const std::vector<float>& x,
                 std::vector<double>& logits, std::vector<double>& magnitude) {
  const int T = s.tokens, E = s.experts, H = s.hidden;
  logits.assign(size_t(T) * E, 0.0);
  magnitude.assign(size_t(T) * E, 0.0);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      double sum = 0, mag = 0;
      for (int i = 0; i < H; ++i) {
        const double p = double(x[size_t(t) * H + i]) * bf16_to_float(d.router[size_t(e) * H + i]);
        sum += p;
        mag += std::fabs(p);
      }
      logits[size_t(t) * E + e] = sum;
      magnitude[size_t(t) * E + e] = mag;
    }
}

// bf16(h + r) per element (exact on the host: fp32 sum of two bf16, rounded to nearest even).
std::vector<bf16> host_residual(const HostData& d) {
  std::vector<bf16> r(d.h.size());
  for (size_t i = 0; i < r.size(); ++i)
    r[i] = float_to_bf16(bf16_to_float(d.h[i]) + bf16_to_float(d.residual[i]));
  return r;
}

// Approximate normed rows (double sum of squares): within a bf16 ulp of the kernel's, enough to
// screen the data for near-ties.
std::vector<float> host_x(const HostData& d, const Shape& s) {
  const int T = s.tokens, H = s.hidden;
  std::vector<float> x(size_t(T) * H);
  for (int t = 0; t < T; ++t) {
    double sq = 0;
    for (int i = 0; i < H; ++i) {
      const double v = double(bf16_to_float(d.h[size_t(t) * H + i])) +
                       bf16_to_float(d.residual[size_t(t) * H + i]);
      sq += v * v;
    }
    const double inv = 1.0 / std::sqrt(sq / H + kEps);
    for (int i = 0; i < H; ++i) {
      const float r = bf16_to_float(float_to_bf16(bf16_to_float(d.h[size_t(t) * H + i]) +
                                                  bf16_to_float(d.residual[size_t(t) * H + i])));
      x[size_t(t) * H + i] =
          bf16_to_float(float_to_bf16(float(r * inv * bf16_to_float(d.norm_w[i]))));
    }
  }
  return x;
}

// No token has two of its k + 1 largest logits closer than 1e-3 · (std of the logits).
bool well_separated(const std::vector<double>& logits, const Shape& s) {
  const int T = s.tokens, E = s.experts;
  double sq = 0;
  for (double v : logits) sq += v * v;
  const double gap = 1e-3 * std::sqrt(sq / double(logits.size()));
  for (int t = 0; t < T; ++t) {
    std::vector<double> row(logits.begin() + size_t(t) * E, logits.begin() + size_t(t + 1) * E);
    std::sort(row.begin(), row.end(), std::greater<double>());
    for (int j = 0; j < std::min(s.top_k + 1, E) - 1; ++j)
      if (row[j] - row[j + 1] < gap) return false;
  }
  return true;
}

HostData make_data(const Shape& s) {
  const int T = s.tokens, E = s.experts, H = s.hidden;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng(seed * 1000003 + uint64_t(T) * 131 + uint64_t(E) * 7 + uint64_t(H));
    HostData d;
    d.h = serval::testing::moe_util::random_bf16(size_t(T) * H, 1.0f, rng);
    d.residual = serval::testing::moe_util::random_bf16(size_t(T) * H, 2.0f, rng);
    d.norm_w.resize(size_t(H));
    for (auto& w : d.norm_w) w = float_to_bf16(1.0f + 0.5f * rng.uniform());
    d.router = serval::testing::moe_util::random_bf16(size_t(E) * H, 0.05f, rng);
    std::vector<double> logits, mag;
    host_logits(d, s, host_x(d, s), logits, mag);
    if (well_separated(logits, s)) return d;
  }
  throw std::runtime_error("moe_norm_router_test: no well-separated data in 200 seeds");
}

// Device buffers of one fused (or reference) call, routing outputs shaped as moe_forward_cuda's
// workspace.
struct Instance {
  Shape s;
  DeviceBuffer h, residual, norm_w, router, x, logits, ids, weights, e2p, p2t, tile_expert,
      num_tiles;
  MoeNormRouterParams p{};

  Instance(const Shape& shape, const HostData& d)
      : s(shape),
        h(size_t(s.tokens) * s.hidden * 2),
        residual(size_t(s.tokens) * s.hidden * 2),
        norm_w(size_t(s.hidden) * 2),
        router(size_t(s.experts) * s.hidden * 2),
        x(size_t(s.tokens) * s.hidden * 2),
        logits(size_t(s.tokens) * s.experts * 4),
        ids(size_t(s.tokens) * s.top_k * 4),
        weights(size_t(s.tokens) * s.top_k * 4),
        e2p(size_t(s.tokens) * s.top_k * 4),
        p2t(size_t(s.max_tiles()) * s.tile() * 4),
        tile_expert(size_t(s.max_tiles()) * 4),
        num_tiles(4) {
    h.upload(d.h);
    norm_w.upload(d.norm_w);
    router.upload(d.router);
    reset(d);
    p.h = h.as<bf16>();
    p.residual = residual.as<bf16>();
    p.norm_weight = norm_w.as<bf16>();
    p.router = router.as<bf16>();
    p.x = x.as<bf16>();
    p.logits = logits.as<float>();
    p.hidden = s.hidden;
    p.eps = kEps;
    MoeRoutingParams& r = p.routing;
    r.logits = logits.as<float>();
    r.num_tokens = s.tokens;
    r.num_experts = s.experts;
    r.top_k = s.top_k;
    r.method = RoutingMethod::kSoftmaxTopK;
    r.renormalize = true;
    r.local_offset = s.local_offset;
    r.num_local = s.locals();
    r.tile = s.tile();
    r.topk_ids = ids.as<int32_t>();
    r.topk_weights = weights.as<float>();
    r.expanded_to_permuted = e2p.as<int32_t>();
    r.permuted_to_token = p2t.as<int32_t>();
    r.tile_expert = tile_expert.as<int32_t>();
    r.num_tiles = num_tiles.as<int32_t>();
  }

  // Fresh residual input, outputs poisoned.
  void reset(const HostData& d) {
    residual.upload(d.residual);
    for (DeviceBuffer* b : {&x, &logits, &ids, &weights, &e2p, &p2t, &tile_expert, &num_tiles})
      b->poison();
  }
};

struct Outputs {
  std::vector<bf16> residual, x;
  std::vector<float> logits, weights;
  std::vector<int32_t> ids, e2p, p2t, tile_expert;
  int num_tiles = -1;
};

Outputs download(const Instance& in) {
  cuda_ok(cudaDeviceSynchronize(), "kernels");
  const Shape& s = in.s;
  const size_t rows = size_t(s.tokens) * s.hidden, pairs = size_t(s.tokens) * s.top_k;
  Outputs o;
  o.residual = in.residual.download<bf16>(rows);
  o.x = in.x.download<bf16>(rows);
  o.logits = in.logits.download<float>(size_t(s.tokens) * s.experts);
  o.weights = in.weights.download<float>(pairs);
  o.ids = in.ids.download<int32_t>(pairs);
  o.e2p = in.e2p.download<int32_t>(pairs);
  o.num_tiles = in.num_tiles.download<int32_t>(1)[0];
  // Only the rows and tiles in use are defined.
  const int tiles = std::clamp(o.num_tiles, 0, s.max_tiles());
  o.p2t = in.p2t.download<int32_t>(size_t(tiles) * s.tile());
  o.tile_expert = in.tile_expert.download<int32_t>(size_t(tiles));
  return o;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void expect_same_maps(const Outputs& got, const Outputs& want) {
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.e2p, want.e2p);
  EXPECT_EQ(got.num_tiles, want.num_tiles);
  EXPECT_EQ(got.p2t, want.p2t);
  EXPECT_EQ(got.tile_expert, want.tile_expert);
}

// Every output bit for bit.
void expect_identical(const Outputs& got, const Outputs& want) {
  EXPECT_TRUE(same_bits(got.residual, want.residual)) << "residual";
  EXPECT_TRUE(same_bits(got.x, want.x)) << "normed x";
  EXPECT_TRUE(same_bits(got.logits, want.logits)) << "logits";
  EXPECT_TRUE(same_bits(got.weights, want.weights)) << "topk weights";
  expect_same_maps(got, want);
}

void run_case(const Shape& s) {
  SCOPED_TRACE(::testing::Message()
               << "tokens " << s.tokens << ", E " << s.experts << ", k " << s.top_k << ", hidden "
               << s.hidden << ", local [" << s.local_offset << ", +" << s.locals() << ")");
  const HostData d = make_data(s);
  Instance fused(s, d), ref(s, d), ref_same(s, d);
  ASSERT_TRUE(moe_norm_router_supported(fused.p));
  ASSERT_NO_THROW(moe_norm_router_topk(fused.p, nullptr));  // the trace names the case

  // Unfused: rms_norm with the residual; routing on the fused logits (same inputs: every bit
  // equal) and on host logits from rms_norm's rows (ids/maps equal, weights close).
  rms_norm({ref.h.as<bf16>(), ref.residual.as<bf16>(), ref.norm_w.as<bf16>(), ref.x.as<bf16>(),
            s.tokens, s.hidden, kEps},
           nullptr);
  MoeRoutingParams same = ref_same.p.routing;
  same.logits = fused.logits.as<float>();
  cuda_ok(cudaDeviceSynchronize(), "fused kernel");
  moe_routing(same, nullptr);
  const Outputs got = download(fused), same_out = download(ref_same);
  std::vector<bf16> ref_x = ref.x.download<bf16>(size_t(s.tokens) * s.hidden);
  std::vector<bf16> ref_residual = ref.residual.download<bf16>(size_t(s.tokens) * s.hidden);

  // logits_only (the consumer routes): the same residual, x and logits, no routing output.
  Instance logits_only(s, d);
  logits_only.p.logits_only = true;
  logits_only.ids.poison();
  ASSERT_NO_THROW(moe_norm_router_topk(logits_only.p, nullptr));
  const Outputs lo = download(logits_only);
  EXPECT_TRUE(same_bits(lo.residual, got.residual)) << "logits_only residual";
  EXPECT_TRUE(same_bits(lo.x, got.x)) << "logits_only normed x";
  EXPECT_TRUE(same_bits(lo.logits, got.logits)) << "logits_only logits";
  for (int32_t id : lo.ids) EXPECT_EQ(id, -1) << "logits_only wrote the routing";

  EXPECT_TRUE(same_bits(got.residual, ref_residual)) << "residual vs rms_norm";
  EXPECT_TRUE(same_bits(got.residual, host_residual(d))) << "residual vs bf16(h + r)";
  EXPECT_TRUE(same_bits(got.x, ref_x)) << "normed x vs rms_norm";

  std::vector<float> xf(ref_x.size());
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_float(ref_x[i]);
  std::vector<double> logits, mag;
  host_logits(d, s, xf, logits, mag);
  int bad = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    // fp32 sums of H products in a fixed order: rel 1e-5 of the logit, plus 1e-6 of Σ|products|
    // for logits near zero (cancellation). Expected error: a few fp32 ulps of the partial sums,
    // ~1e-7 of Σ|products|. NaN (an unwritten logit) fails.
    const double err = std::fabs(double(got.logits[i]) - logits[i]);
    if (!(err <= 1e-5 * std::fabs(logits[i]) + 1e-6 * mag[i]) && bad++ < 5)
      ADD_FAILURE() << "logit " << i << ": " << got.logits[i] << " vs " << logits[i];
  }
  EXPECT_EQ(bad, 0);

  // Routing: the shared device code on the same logits gives the same bits.
  EXPECT_TRUE(same_bits(got.weights, same_out.weights)) << "weights vs moe_routing";
  expect_same_maps(got, same_out);

  // And on the exact logits (rounded to fp32): the same choices (no near-ties in the data).
  std::vector<float> exact(logits.begin(), logits.end());
  ref.logits.upload(exact);
  moe_routing(ref.p.routing, nullptr);
  const Outputs exact_out = download(ref);
  expect_same_maps(got, exact_out);
  for (size_t i = 0; i < got.weights.size(); ++i)
    EXPECT_NEAR(got.weights[i], exact_out.weights[i], 1e-5) << "pair " << i;
  EXPECT_GT(got.num_tiles, 0);
}

TEST(MoeNormRouter, MatchesUnfused) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (int hidden : {2048, 4096})
    for (int T : {1, 2, 3, 5, 8}) {
      run_case({T, 128, 8, hidden});  // Qwen3-30B-A3B
      run_case({T, 8, 2, hidden});    // Mixtral-like
    }
}

TEST(MoeNormRouter, OtherShapes) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  run_case({2, 16, 4, 64});             // the tiny fixtures: rms_norm runs one 32-thread warp
  run_case({4, 256, 8, 7168});          // 4 rows per CTA, 4 chunks per thread (3.5 in use)
  run_case({4, 64, 6, 1024});           // one row per CTA, half the threads idle in the norm
  run_case({3, 128, 8, 2048, 32, 64});  // expert-parallel slice [32, 96)
  run_case({6, 160, 6, 5120});          // 640 vectors: 3 of 4 chunks per thread, 40 CTAs a token
  run_case({8, 256, 8, 7168});          // 4 rows per CTA, 512 CTAs (the grid bound is soft)
}

TEST(MoeNormRouter, Supported) {
  // Host-only checks of the shape gate (pointers are only checked for alignment).
  alignas(16) static bf16 buf[8];
  float logits = 0;
  auto params = [&](int T, int H, int E) {
    MoeNormRouterParams p{};
    p.h = p.norm_weight = p.router = buf;
    p.residual = p.x = buf;
    p.logits = &logits;
    p.hidden = H;
    p.routing.num_tokens = T;
    p.routing.num_experts = E;
    p.routing.top_k = 2;
    p.routing.num_local = E;
    return p;
  };
  EXPECT_TRUE(moe_norm_router_supported(params(1, 2048, 128)));
  EXPECT_TRUE(moe_norm_router_supported(params(8, 4096, 8)));
  EXPECT_FALSE(moe_norm_router_supported(params(9, 2048, 128)));  // > 8 tokens
  EXPECT_FALSE(moe_norm_router_supported(params(0, 2048, 128)));  // no tokens
  EXPECT_FALSE(moe_norm_router_supported(params(1, 2052, 128)));  // hidden % 8
  EXPECT_FALSE(moe_norm_router_supported(params(1, 8200, 128)));  // hidden > 8192
  EXPECT_TRUE(moe_norm_router_supported(params(8, 8192, 128)));   // rows held in registers
  EXPECT_FALSE(moe_norm_router_supported(params(1, 2048, 512)));  // > 256 experts
  MoeNormRouterParams p = params(1, 2048, 128);
  p.h = buf + 1;  // misaligned
  EXPECT_FALSE(moe_norm_router_supported(p));
  // The CUDA backend asks before it allocates the outputs: the gate must not look at them (it
  // once required logits, so the engine never took the fused path).
  p = params(1, 2048, 128);
  p.logits = nullptr;
  EXPECT_TRUE(moe_norm_router_supported(p));
}

// K instances launched back to back without a sync, twice, then from a graph replayed three
// times: every launch's outputs equal one eager launch bit for bit (the arrival counter is back
// at zero after each launch; the kernel is deterministic).
TEST(MoeNormRouter, BackToBackAndGraphReplay) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (const Shape& s : {Shape{3, 128, 8, 2048}, Shape{8, 8, 2, 4096}, Shape{8, 128, 8, 2048}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << s.tokens << ", E " << s.experts);
    const HostData d = make_data(s);
    Instance one(s, d);
    moe_norm_router_topk(one.p, nullptr);
    const Outputs want = download(one);

    constexpr int kCopies = 4;
    std::vector<std::unique_ptr<Instance>> copies;
    for (int i = 0; i < kCopies; ++i) copies.push_back(std::make_unique<Instance>(s, d));
    cudaStream_t stream;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    for (int round = 0; round < 2; ++round) {
      for (auto& c : copies) c->reset(d);
      cuda_ok(cudaDeviceSynchronize(), "reset");
      for (auto& c : copies) moe_norm_router_topk(c->p, stream);
      cuda_ok(cudaStreamSynchronize(stream), "back to back");
      for (int i = 0; i < kCopies; ++i) {
        SCOPED_TRACE(::testing::Message() << "eager round " << round << ", launch " << i);
        expect_identical(download(*copies[size_t(i)]), want);
      }
    }

    const serval::testing::CapturedGraph graph(stream, [&](cudaStream_t) {
      for (auto& c : copies) moe_norm_router_topk(c->p, stream);
    });
    for (int replay = 0; replay < 3; ++replay) {
      for (auto& c : copies) c->reset(d);
      cuda_ok(cudaDeviceSynchronize(), "reset");
      graph.launch(stream);
      cuda_ok(cudaStreamSynchronize(stream), "replay");
      for (int i = 0; i < kCopies; ++i) {
        SCOPED_TRACE(::testing::Message() << "replay " << replay << ", launch " << i);
        expect_identical(download(*copies[size_t(i)]), want);
      }
    }
    cudaStreamDestroy(stream);
  }
}

// µs per layer of fused vs unfused (rms_norm + router linear as the CUDA backend runs it: the
// bf16 GEMV up to 2 tokens, cuBLASLt above + moe_routing), and of the fused kernel without its
// routing tail (logits_only), 200 layers back to back in one CUDA graph, median of 30 replays. The
// residual grows over the launches (timing only).
TEST(MoeNormRouterBench, DISABLED_FusedVsUnfused) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  constexpr int kLaunches = 200;
  backend::cuda::CublasLtGemm gemm;
  std::printf("µs per layer, %d layers in one CUDA graph (median of 30 replays)\n", kLaunches);
  std::printf(
      "tokens    E  k hidden | unfused (norm + router + routing) | fused | saved | logits only\n");
  for (const Shape& s : {Shape{1, 128, 8, 2048}, Shape{2, 128, 8, 2048}, Shape{4, 128, 8, 2048},
                         Shape{6, 128, 8, 2048}, Shape{8, 128, 8, 2048}, Shape{1, 8, 2, 4096},
                         Shape{8, 8, 2, 4096}}) {
    const HostData d = make_data(s);
    Instance in(s, d);
    const MoeNormRouterParams& p = in.p;
    auto router_linear = [&](cudaStream_t st) {
      if (s.tokens <= 2) {
        bf16_gemv({p.x, p.router, nullptr, p.logits, true, s.tokens, s.experts, s.hidden}, st);
      } else {
        gemm.run(p.x, p.router, nullptr, p.logits, DType::kF32, s.tokens, s.experts, s.hidden, st);
      }
    };
    router_linear(nullptr);  // plans cuBLASLt outside the capture
    cuda_ok(cudaDeviceSynchronize(), "warm-up");
    const float unfused = graph_us(
        [&](cudaStream_t st) {
          for (int i = 0; i < kLaunches; ++i) {
            rms_norm({p.h, p.residual, p.norm_weight, p.x, s.tokens, s.hidden, kEps}, st);
            router_linear(st);
            moe_routing(p.routing, st);
          }
        },
        kLaunches);
    auto fused_us = [&](const MoeNormRouterParams& q) {
      return graph_us(
          [&](cudaStream_t st) {
            for (int i = 0; i < kLaunches; ++i) moe_norm_router_topk(q, st);
          },
          kLaunches);
    };
    const float fused = fused_us(p);
    MoeNormRouterParams logits_only = p;
    logits_only.logits_only = true;
    const float no_routing = fused_us(logits_only);
    std::printf("%6d %4d %2d %6d | %33.2f | %5.2f | %5.2f | %11.2f\n", s.tokens, s.experts, s.top_k,
                s.hidden, unfused, fused, unfused - fused, no_routing);
  }
}

}  // namespace
}  // namespace serval::kernels::cuda
