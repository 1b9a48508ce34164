// p2p_all_reduce_norm on every GPU of the machine (skipped with fewer than two or without peer
// access). Every rank holds its own delta rows and the same residual rows; after the call every
// rank must hold residual + bf16(Σ_r delta_r in rank order) exactly (the host computes the same
// fp32 sums) and x = RMSNorm(residual) · weight within one bf16 rounding of the host's (the sum
// of squares is added in another order than the host's), the same bits on every rank. Fused and
// plain all-reduces alternate on the same blocks, eagerly and replayed from CUDA graphs.
#include "kernels/cuda/comm/p2p_all_reduce_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cuda/comm/p2p_all_reduce.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/p2p_test_group.h"

namespace serval::testing {
namespace {

namespace kc = kernels::cuda;

constexpr float kEps = 1e-5f;

struct Shape {
  int rows, hidden;
};

struct Inputs {
  std::vector<std::vector<bf16>> delta;  // [rank][rows · hidden]
  std::vector<bf16> residual, weight;
};

Inputs make_inputs(int n, int call, Shape s) {
  Inputs in;
  const size_t count = size_t(s.rows) * size_t(s.hidden);
  for (int r = 0; r < n; ++r)
    in.delta.push_back(random_bf16(count, uint32_t(7000 * call + r), -2.0f, 2.0f));
  in.residual = random_bf16(count, uint32_t(7000 * call + 99), -3.0f, 3.0f);
  in.weight = random_bf16(size_t(s.hidden), uint32_t(7000 * call + 98), 0.5f, 1.5f);
  return in;
}

// The host's residual (exact) and x (reference) after one call on `residual`.
void host_step(const Inputs& in, Shape s, std::vector<bf16>& residual, std::vector<float>& x) {
  x.assign(residual.size(), 0.0f);
  for (int t = 0; t < s.rows; ++t) {
    std::vector<float> v(size_t(s.hidden));
    double sum_sq = 0.0;
    for (int j = 0; j < s.hidden; ++j) {
      const size_t i = size_t(t) * s.hidden + j;
      float sum = 0.0f;
      for (const std::vector<bf16>& d : in.delta) sum += bf16_to_float(d[i]);
      v[size_t(j)] = bf16_to_float(float_to_bf16(sum)) + bf16_to_float(residual[i]);
      sum_sq += double(v[size_t(j)]) * v[size_t(j)];
      residual[i] = float_to_bf16(v[size_t(j)]);
    }
    const float inv = float(1.0 / std::sqrt(sum_sq / s.hidden + kEps));
    for (int j = 0; j < s.hidden; ++j) {
      const size_t i = size_t(t) * s.hidden + j;
      x[i] = bf16_to_float(residual[i]) * inv * bf16_to_float(in.weight[size_t(j)]);
    }
  }
}

// x within one bf16 rounding (2^-8 relative) of the host, plus a float-order allowance.
void expect_close(const std::vector<bf16>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    const float g = bf16_to_float(got[i]);
    if (std::fabs(g - want[i]) > std::fabs(want[i]) * (1.0f / 128) + 1e-6f) {
      ADD_FAILURE() << what << " element " << i << ": " << g << " vs " << want[i];
      ++bad;
    }
  }
}

struct RankResult {
  std::vector<bf16> residual, x;
};

std::vector<uint16_t> bits(const std::vector<bf16>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
  return b;
}

// One fused call of every rank (a thread each) on the device buffers it uploads; with `plain`,
// a plain all-reduce of that many bf16 values runs before it on the same blocks.
std::vector<RankResult> run_call(Group& g, int call, Shape s, int64_t plain) {
  const int n = g.n;
  const Inputs in = make_inputs(n, call, s);
  std::vector<RankResult> out(static_cast<size_t>(n));
  run_ranks(n, [&](int r, cudaStream_t st) {
    DeviceBuffer<bf16> delta(in.delta[size_t(r)]), residual(in.residual), weight(in.weight),
        x(std::vector<bf16>(in.residual.size(), bf16{0xFFFF}));
    // Queued right before the fused call, no host sync between (PDL may overlap them).
    DeviceBuffer<bf16> other(random_bf16(size_t(std::max<int64_t>(plain, 8)), uint32_t(call)));
    if (plain > 0)
      kc::p2p_all_reduce(
          {other.get(), plain, DType::kBF16, r, n, kMaxBytes, g.blocks[size_t(r)], g.aborted}, st);
    const kc::P2pAllReduceNormParams p{
        delta.get(), residual.get(), weight.get(),        x.get(),  s.rows, s.hidden, kEps, r,
        n,           kMaxBytes,      g.blocks[size_t(r)], g.aborted};
    kc::p2p_all_reduce_norm(p, st);
    cuda_check(cudaStreamSynchronize(st), "sync");
    out[size_t(r)] = {residual.download(), x.download()};
  });
  return out;
}

TEST(P2pAllReduceNorm, MatchesHostAlternatingWithPlainCalls) {
  const int n = gpu_count_for_collectives();
  if (n < 2 || !peers_ok(n)) GTEST_SKIP() << "needs two peer-accessible CUDA GPUs: skipped";
  Group g(n);
  // 33 and 40 rows: more rows than CTAs; hidden 16384: 4 vectors per thread; 16 rows of 8192
  // with 2 ranks fill the 1 MB of LL staging (8-byte words per 4 bytes of payload).
  const std::vector<Shape> shapes = {{1, 8192}, {3, 4096},  {33, 2048}, {8, 8192},
                                     {1, 2048}, {16, 8192}, {40, 1024}, {2, 16384}};
  for (int rep = 0; rep < 2; ++rep)  // the staging halves alternate: every shape on both
    for (size_t c = 0; c < shapes.size(); ++c) {
      const Shape s = shapes[c];
      const int call = int(c) + 100 * rep;
      SCOPED_TRACE("rows " + std::to_string(s.rows) + " hidden " + std::to_string(s.hidden) +
                   " rep " + std::to_string(rep));
      const std::vector<RankResult> got = run_call(g, call, s, c % 3 == 1 ? 65536 : 0);
      const Inputs in = make_inputs(n, call, s);
      std::vector<bf16> residual = in.residual;
      std::vector<float> x;
      host_step(in, s, residual, x);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(bits(got[size_t(r)].residual), bits(residual)) << "rank " << r;
        expect_close(got[size_t(r)].x, x, "rank " + std::to_string(r));
        EXPECT_EQ(bits(got[size_t(r)].x), bits(got[0].x)) << "rank " << r << " differs from rank 0";
      }
    }
}

// Three fused calls captured in one graph per rank, replayed twice: the residual accumulates six
// sums (the call counters live on the device, so every replay makes new calls).
TEST(P2pAllReduceNorm, GraphReplaysAccumulate) {
  const int n = gpu_count_for_collectives();
  if (n < 2 || !peers_ok(n)) GTEST_SKIP() << "needs two peer-accessible CUDA GPUs: skipped";
  Group g(n);
  const Shape s{4, 8192};
  const Inputs in = make_inputs(n, 5, s);
  std::vector<RankResult> out(static_cast<size_t>(n));
  run_ranks(n, [&](int r, cudaStream_t st) {
    DeviceBuffer<bf16> delta(in.delta[size_t(r)]), residual(in.residual), weight(in.weight),
        x(std::vector<bf16>(in.residual.size(), bf16{0xFFFF}));
    const kc::P2pAllReduceNormParams p{
        delta.get(), residual.get(), weight.get(),        x.get(),  s.rows, s.hidden, kEps, r,
        n,           kMaxBytes,      g.blocks[size_t(r)], g.aborted};
    CapturedGraph graph(st, [&](cudaStream_t cs) {
      for (int i = 0; i < 3; ++i) kc::p2p_all_reduce_norm(p, cs);
    });
    for (int rep = 0; rep < 2; ++rep) graph.launch(st);
    cuda_check(cudaStreamSynchronize(st), "sync");
    out[size_t(r)] = {residual.download(), x.download()};
  });
  if (HasFailure()) return;
  std::vector<bf16> residual = in.residual;
  std::vector<float> x;
  for (int i = 0; i < 6; ++i) host_step(in, s, residual, x);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bits(out[size_t(r)].residual), bits(residual)) << "rank " << r;
    expect_close(out[size_t(r)].x, x, "rank " + std::to_string(r));
  }
}

TEST(P2pAllReduceNorm, RejectsShapesOutsideTheContract) {
  uint8_t* fake = reinterpret_cast<uint8_t*>(uintptr_t(256));
  bf16* row = reinterpret_cast<bf16*>(uintptr_t(512));
  uint32_t word = 0;
  kc::P2pAllReduceNormParams p{row, row, row, row, 1, 8192, kEps, 0, 2, kMaxBytes, fake, &word};
  EXPECT_TRUE(kc::p2p_all_reduce_norm_supported(p));
  p.hidden = 8196;  // not a multiple of 8
  EXPECT_FALSE(kc::p2p_all_reduce_norm_supported(p));
  EXPECT_THROW(kc::p2p_all_reduce_norm(p, nullptr), InvalidArgument);
  p.hidden = 8192;
  p.rows = 17;  // 2 ranks · 17 rows · 32 KB of LL words > 1 MB of staging
  EXPECT_FALSE(kc::p2p_all_reduce_norm_supported(p));
  p.rows = 1;
  p.hidden = 32768;  // above 512 threads · 4 vectors · 8
  EXPECT_FALSE(kc::p2p_all_reduce_norm_supported(p));
  p.hidden = 8192;
  p.ranks = 1;
  EXPECT_FALSE(kc::p2p_all_reduce_norm_supported(p));
}

}  // namespace
}  // namespace serval::testing
