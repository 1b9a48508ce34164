// GPU MoE routing vs kernels::cpu::route (ids exact, weights within 1e-5) and the tile maps
// checked against their definition; the few-token kernel (≤ 8 tokens) also against its exact
// row assignment (ranks in pair order). Every kernel path: few-token (1–8 tokens), top-k + maps
// (> 8) with either map builder (one CTA, or the multi-CTA kernels over chunks of pairs), and
// the fused single CTA of moe_routing_single_cta (any count ≤ 128).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/moe/moe_routing.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_test_util.h"

namespace serval::kernels::cuda {
namespace {

using serval::testing::moe_util::DeviceBuffer;
using serval::testing::moe_util::Rng;

struct Case {
  int tokens, experts, top_k;
  RoutingMethod method;
  bool renormalize;
  int groups = 1, topk_groups = 1;
  float scale = 1.0f;
  int local_offset = 0, num_local = -1;  // −1: all experts
  int tile = 8;
  bool zero_logits = false;  // all ties: every token picks experts 0..k-1
  int levels = 0;            // > 0: logits drawn from {0, 1, ..., levels - 1}: partial ties
};

using Launch = void (*)(const MoeRoutingParams&, cudaStream_t);

void routing_default(const MoeRoutingParams& p, cudaStream_t s) {
  moe_routing(p, s);
}
void routing_single_cta_maps(const MoeRoutingParams& p, cudaStream_t s) {
  moe_routing(p, s, MoeMapsKernel::kSingleCta);
}
void routing_chunked_maps(const MoeRoutingParams& p, cudaStream_t s) {
  moe_routing(p, s, MoeMapsKernel::kChunked);
}

const char* launch_name(Launch launch) {
  return launch == routing_default           ? ""
         : launch == routing_single_cta_maps ? ", single-CTA maps"
         : launch == routing_chunked_maps    ? ", multi-CTA maps"
                                             : ", fused single-CTA kernel";
}

void run_case(const Case& c, Launch launch = routing_default) {
  SCOPED_TRACE(::testing::Message()
               << "tokens " << c.tokens << ", E " << c.experts << ", k " << c.top_k << ", method "
               << int(c.method) << ", local [" << c.local_offset << ", +" << c.num_local
               << "), tile " << c.tile << launch_name(launch));
  const int T = c.tokens, E = c.experts, k = c.top_k;
  const int num_local = c.num_local < 0 ? E : c.num_local;
  Rng rng(1000 + T * 7 + E + k + int(c.method));
  std::vector<float> logits(size_t(T) * E), bias(E);
  for (auto& v : logits)
    v = c.zero_logits  ? 0.0f
        : c.levels > 0 ? float(rng.next() % uint32_t(c.levels))
                       : 2.0f * rng.normal();
  for (auto& v : bias) v = 0.1f * rng.uniform();
  const bool grouped = c.method == RoutingMethod::kSigmoidGroupedTopK;

  // CPU oracle.
  std::vector<int32_t> ref_ids(size_t(T) * k);
  std::vector<float> ref_w(size_t(T) * k);
  RouterParams rp{logits.data(),
                  grouped ? bias.data() : nullptr,
                  ref_ids.data(),
                  ref_w.data(),
                  T,
                  E,
                  k,
                  c.method,
                  c.renormalize,
                  c.groups,
                  c.topk_groups,
                  c.scale};
  cpu::route(rp);

  const int pairs = T * k;
  const int max_tiles = moe_max_tiles(pairs, num_local, c.tile);
  DeviceBuffer d_logits(logits.size() * 4), d_bias(bias.size() * 4), d_ids(pairs * 4),
      d_w(pairs * 4), d_e2p(pairs * 4), d_p2t(size_t(max_tiles) * c.tile * 4),
      d_te(max_tiles * 4 + 4), d_nt(4), d_cc(size_t(kMoeMaxMapChunks) * std::max(num_local, 1) * 4);
  d_logits.upload(logits);
  d_bias.upload(bias);
  for (DeviceBuffer* b : {&d_ids, &d_w, &d_e2p, &d_p2t, &d_te, &d_nt, &d_cc}) b->poison();

  MoeRoutingParams p{};
  p.logits = d_logits.as<float>();
  p.correction_bias = grouped ? d_bias.as<float>() : nullptr;
  p.num_tokens = T;
  p.num_experts = E;
  p.top_k = k;
  p.method = c.method;
  p.renormalize = c.renormalize;
  p.num_groups = c.groups;
  p.topk_groups = c.topk_groups;
  p.routed_scaling_factor = c.scale;
  p.local_offset = c.local_offset;
  p.num_local = num_local;
  p.tile = c.tile;
  p.topk_ids = d_ids.as<int32_t>();
  p.topk_weights = d_w.as<float>();
  p.expanded_to_permuted = d_e2p.as<int32_t>();
  p.permuted_to_token = d_p2t.as<int32_t>();
  p.tile_expert = d_te.as<int32_t>();
  p.num_tiles = d_nt.as<int32_t>();
  p.chunk_counts = d_cc.as<int32_t>();
  launch(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto ids = d_ids.download<int32_t>(pairs);
  auto w = d_w.download<float>(pairs);
  for (int i = 0; i < pairs; ++i) {
    ASSERT_EQ(ids[i], ref_ids[i]) << "pair " << i << " (token " << i / k << ")";
    // fp32 sums in a different order than the CPU: 1e-5 relative (weights are ≤ scale).
    ASSERT_NEAR(w[i], ref_w[i], 1e-5f * std::max(1.0f, c.scale)) << "pair " << i;
  }

  // Maps: expected per-expert counts and tile offsets from the CPU ids.
  std::vector<int> count(num_local, 0), tile_off(num_local + 1, 0);
  for (int32_t e : ref_ids)
    if (e >= c.local_offset && e < c.local_offset + num_local) ++count[e - c.local_offset];
  for (int e = 0; e < num_local; ++e)
    tile_off[e + 1] = tile_off[e] + (count[e] + c.tile - 1) / c.tile;
  const int num_tiles = d_nt.download<int32_t>(1)[0];
  ASSERT_EQ(num_tiles, tile_off[num_local]);
  ASSERT_LE(num_tiles, max_tiles);
  auto te = d_te.download<int32_t>(num_tiles);
  for (int e = 0; e < num_local; ++e)
    for (int t = tile_off[e]; t < tile_off[e + 1]; ++t) ASSERT_EQ(te[t], e) << "tile " << t;
  const int rows = num_tiles * c.tile;
  auto e2p = d_e2p.download<int32_t>(pairs);
  auto p2t = d_p2t.download<int32_t>(rows);
  std::vector<int> used(rows, 0);
  for (int i = 0; i < pairs; ++i) {
    const int local = ref_ids[i] - c.local_offset;
    if (local < 0 || local >= num_local) {
      ASSERT_EQ(e2p[i], -1) << "non-local pair " << i;
      continue;
    }
    // Within the expert's first count rows: its valid rows are a prefix of its tiles, which the
    // throughput kernels' narrow tiles rely on (moe_wgmma::tile_width).
    const int row = e2p[i];
    ASSERT_GE(row, tile_off[local] * c.tile) << "pair " << i;
    ASSERT_LT(row, tile_off[local] * c.tile + count[local]) << "pair " << i;
    ASSERT_EQ(p2t[row], i / k) << "row " << row;
    ++used[row];
  }
  for (int r = 0; r < rows; ++r) {
    if (used[r] == 0) {
      ASSERT_EQ(p2t[r], -1) << "padding row " << r;
    }
    ASSERT_LE(used[r], 1) << "row " << r;
  }
  // The few-token kernel assigns each expert's rows in pair order.
  if (launch != moe_routing_single_cta && T <= 8) {
    std::vector<int> next(num_local, 0);
    for (int i = 0; i < pairs; ++i) {
      const int local = ref_ids[i] - c.local_offset;
      if (local < 0 || local >= num_local) continue;
      ASSERT_EQ(e2p[i], tile_off[local] * c.tile + next[local]++) << "pair " << i;
    }
  }
}

class MoeRoutingGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  }
};

TEST_F(MoeRoutingGpu, SoftmaxTopKRenormalized) {
  for (int T : {1, 3, 9, 17, 128, 129, 1000})  // 1–8: few-token kernel, 9+: two kernels
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true});
  run_case({8192, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 128});
}

TEST_F(MoeRoutingGpu, SoftmaxTopKPlain) {
  for (int T : {1, 64, 300}) run_case({T, 8, 2, RoutingMethod::kSoftmaxTopK, false});
  run_case({5, 60, 4, RoutingMethod::kSoftmaxTopK, false});  // E not a multiple of 32
}

TEST_F(MoeRoutingGpu, TopKSoftmax) {
  for (int T : {1, 17, 255}) run_case({T, 8, 2, RoutingMethod::kTopKSoftmax, false});
  run_case({33, 128, 8, RoutingMethod::kTopKSoftmax, false, 1, 1, 1.0f, 0, -1, 16});
}

TEST_F(MoeRoutingGpu, SigmoidGroupedTopK) {
  // DeepSeek-V3 shape: 256 experts in 8 groups, top-4 groups, top-8, scale 2.5.
  for (int T : {1, 9, 200})
    run_case({T, 256, 8, RoutingMethod::kSigmoidGroupedTopK, true, 8, 4, 2.5f});
  run_case({20, 64, 6, RoutingMethod::kSigmoidGroupedTopK, false, 1, 1, 1.0f});
}

TEST_F(MoeRoutingGpu, TiesGoToLowerIndex) {
  run_case({40, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 8, true});
  run_case({200, 8, 2, RoutingMethod::kTopKSoftmax, false, 1, 1, 1.0f, 0, -1, 64, true});
}

// Logits from a few levels: ties within a lane's candidates and across lanes, broken by the lower
// expert index at every rank of the top-k (warp_top_k's per-lane sort and heads).
TEST_F(MoeRoutingGpu, PartialTiesGoToLowerIndex) {
  for (int T : {1, 2, 8, 40}) {
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 8, false, 3});
    run_case({T, 256, 32, RoutingMethod::kSoftmaxTopK, false, 1, 1, 1.0f, 0, -1, 8, false, 2});
    run_case({T, 60, 4, RoutingMethod::kTopKSoftmax, false, 1, 1, 1.0f, 0, -1, 8, false, 4});
    run_case({T, 256, 8, RoutingMethod::kSigmoidGroupedTopK, true, 8, 4, 2.5f, 0, -1, 8, false, 3});
  }
}

TEST_F(MoeRoutingGpu, LocalExpertSlice) {
  for (int T : {1, 17, 255}) {
    run_case({T, 8, 2, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 2, 4, 8});
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 64, 32, 16});
  }
  // Every token's experts are 0..1, outside the slice: no tiles at all.
  run_case({50, 8, 2, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 4, 4, 8, true});
}

// Decode batches (the few-token kernel) and the neighbouring paths, at the Qwen3-30B-A3B shape.
TEST_F(MoeRoutingGpu, FewTokensQwenShape) {
  for (int T : {1, 2, 3, 5, 8, 9, 33, 300})
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true});
  for (int T : {1, 2, 8}) {
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 16});
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 128});
  }
}

TEST_F(MoeRoutingGpu, FewTokensAllMethodsAndShapes) {
  for (int T : {1, 2, 8}) {
    run_case({T, 8, 2, RoutingMethod::kSoftmaxTopK, false});
    run_case({T, 60, 4, RoutingMethod::kSoftmaxTopK, false});  // E not a multiple of 32
    run_case({T, 8, 2, RoutingMethod::kTopKSoftmax, false});
    run_case({T, 128, 8, RoutingMethod::kTopKSoftmax, false, 1, 1, 1.0f, 0, -1, 16});
    run_case({T, 256, 8, RoutingMethod::kSigmoidGroupedTopK, true, 8, 4, 2.5f});
    run_case({T, 64, 6, RoutingMethod::kSigmoidGroupedTopK, false, 1, 1, 1.0f});
    // top_k 32: 8 tokens fill all 256 threads of the few-token kernel with pairs.
    run_case({T, 64, 32, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 8});
    run_case({T, 256, 32, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 8});
  }
}

TEST_F(MoeRoutingGpu, FewTokensTiesAndSlices) {
  for (int T : {1, 2, 8}) {
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 8, true});
    run_case({T, 8, 2, RoutingMethod::kTopKSoftmax, false, 1, 1, 1.0f, 0, -1, 64, true});
    run_case({T, 8, 2, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 2, 4, 8});
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 64, 32, 16});
    run_case({T, 256, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, 256, 8});
    // Ties pick experts 0, 1: nothing in the slice, no tiles.
    run_case({T, 8, 2, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 4, 4, 8, true});
  }
}

// Both map builders forced at every size above the few-token kernel (the default takes the
// multi-CTA one from kMoeChunkedMapsMinTokens tokens): one chunk, several, the chunk cap with
// longer chunks (9000 tokens), ties (every pair on experts 0..k−1), slices, grouped routing.
TEST_F(MoeRoutingGpu, MapBuilders) {
  for (Launch l : {routing_single_cta_maps, routing_chunked_maps}) {
    for (int T : {9, 127, 128, 129, 1000, 8192, 9000})
      run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 128}, l);
    run_case({300, 128, 8, RoutingMethod::kSoftmaxTopK, true}, l);
    run_case({2000, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, -1, 8, true}, l);
    run_case({1000, 128, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 64, 32, 16}, l);
    run_case({1000, 256, 8, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 0, 256, 64}, l);
    run_case({1000, 8, 2, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 4, 4, 8, true}, l);
    run_case({600, 256, 8, RoutingMethod::kSigmoidGroupedTopK, true, 8, 4, 2.5f}, l);
  }
}

// The fused single-CTA kernel the benchmark compares against, at few-token counts too.
TEST_F(MoeRoutingGpu, SingleCtaKernel) {
  for (int T : {1, 2, 8, 33, 128}) {
    run_case({T, 128, 8, RoutingMethod::kSoftmaxTopK, true}, moe_routing_single_cta);
    run_case({T, 8, 2, RoutingMethod::kSoftmaxTopK, true, 1, 1, 1.0f, 2, 4, 8},
             moe_routing_single_cta);
  }
}

}  // namespace
}  // namespace serval::kernels::cuda
