// DISABLED_ benchmark of the small per-layer kernels of a decode step at 1 to 256 tokens
// (Qwen3-30B-A3B: 128 experts, top-8, hidden 2048, vocab 151936): MoE routing (few-token kernel
// or the multi-CTA top-k + maps vs the fused 1024-thread CTA up to 128 tokens), MoE finalize, and
// argmax (split over CTAs vs one CTA per row); and (DISABLED_RoutingMaps) the two map builders of
// larger steps, 16 to 8192 tokens. Each figure: 200 launches back to back (PDL-chained)
// in one CUDA graph, µs per launch, median of 30 replays. "warm": the same input every launch
// (L2-resident); argmax "rotating": 64 different logit buffers in turn (39 MB at 1 row, 311 MB at
// 8: mostly from DRAM). Run: kernels_gpu --gtest_also_run_disabled_tests
// --gtest_filter='MoeSmallKernelsBench.*'
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "kernels/bench_timing.h"
#include "kernels/cuda/moe/moe_gemm.h"
#include "kernels/cuda/moe/moe_routing.h"
#include "kernels/cuda/sampling/argmax.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_test_util.h"

namespace serval::kernels::cuda {
namespace {

using serval::testing::graph_us;
using serval::testing::moe_util::cuda_ok;
using serval::testing::moe_util::DeviceBuffer;
using serval::testing::moe_util::Rng;

constexpr int kExperts = 128, kTopK = 8, kHidden = 2048, kVocab = 151936, kTile = 8;
constexpr int kLaunches = 200, kRotate = 64;

// Routing inputs and outputs of one token count, shaped as moe_forward_cuda's workspace.
struct Routing {
  int tokens, max_tiles;
  DeviceBuffer logits, ids, weights, e2p, p2t, tile_expert, num_tiles, chunk_counts;
  MoeRoutingParams p{};

  explicit Routing(int T, int tile = kTile)
      : tokens(T),
        max_tiles(moe_max_tiles(T * kTopK, kExperts, tile)),
        logits(size_t(T) * kExperts * 4),
        ids(size_t(T) * kTopK * 4),
        weights(size_t(T) * kTopK * 4),
        e2p(size_t(T) * kTopK * 4),
        p2t(size_t(max_tiles) * tile * 4),
        tile_expert(size_t(max_tiles) * 4),
        num_tiles(4),
        chunk_counts(size_t(kMoeMaxMapChunks) * kExperts * 4) {
    Rng rng(31 + T);
    std::vector<float> l(size_t(T) * kExperts);
    for (auto& v : l) v = 2.0f * rng.normal();
    logits.upload(l);
    p.logits = logits.as<float>();
    p.num_tokens = T;
    p.num_experts = kExperts;
    p.top_k = kTopK;
    p.method = RoutingMethod::kSoftmaxTopK;
    p.renormalize = true;
    p.num_local = kExperts;
    p.tile = tile;
    p.topk_ids = ids.as<int32_t>();
    p.topk_weights = weights.as<float>();
    p.expanded_to_permuted = e2p.as<int32_t>();
    p.permuted_to_token = p2t.as<int32_t>();
    p.tile_expert = tile_expert.as<int32_t>();
    p.num_tiles = num_tiles.as<int32_t>();
    p.chunk_counts = chunk_counts.as<int32_t>();
  }
};

template <typename Launch>
double per_launch_us(Launch&& launch) {
  return graph_us(
      [&](cudaStream_t s) {
        for (int i = 0; i < kLaunches; ++i) launch(i, s);
      },
      kLaunches, 30);
}

TEST(MoeSmallKernelsBench, DISABLED_Latency) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  std::printf(
      "µs per launch, %d launches back to back in one CUDA graph (median of 30 replays)\n"
      "tokens | routing new  old(1 CTA×1024) | finalize | argmax warm new  old | argmax "
      "rotating new  old  (byte floor at 4.3 TB/s)\n",
      kLaunches);
  for (int T : {1, 8, 16, 32, 64, 128, 256}) {
    Routing r(T);
    const float route_new = per_launch_us([&](int, cudaStream_t s) { moe_routing(r.p, s); });
    const float route_old =
        T <= 128 ? per_launch_us([&](int, cudaStream_t s) { moe_routing_single_cta(r.p, s); })
                 : 0.0f;

    // Finalize on the maps of this routing (as in a layer), Y random over the padded rows.
    moe_routing(r.p, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "routing");
    Rng rng(77 + T);
    const size_t y_rows = size_t(r.max_tiles) * kTile;
    DeviceBuffer y(y_rows * kHidden * 2), out(size_t(T) * kHidden * 2);
    y.upload(serval::testing::moe_util::random_bf16(y_rows * kHidden, 1.0f, rng));
    const MoeFinalizeParams fp{
        y.as<bf16>(), r.e2p.as<int32_t>(), r.weights.as<float>(), out.as<bf16>(), T, kTopK,
        kHidden};
    const float fin = per_launch_us([&](int, cudaStream_t s) { moe_finalize(fp, s); });

    if (T > 8) {  // batched steps: routing and finalize only (64 rotating logit buffers = GBs)
      std::printf("%6d | %11.2f %16.2f | %8.2f |\n", T, route_new, route_old, fin);
      continue;
    }
    std::vector<std::unique_ptr<DeviceBuffer>> logits;
    for (int i = 0; i < kRotate; ++i) {
      logits.push_back(std::make_unique<DeviceBuffer>(size_t(T) * kVocab * 4));
      std::vector<float> l(size_t(T) * kVocab);
      for (auto& v : l) v = 4.0f * rng.uniform();
      logits.back()->upload(l);
    }
    DeviceBuffer ids(size_t(T) * 4);
    auto params = [&](int i) {
      return ArgmaxParams{logits[size_t(i) % kRotate]->as<float>(), ids.as<int32_t>(), T, kVocab};
    };
    const float am_new = per_launch_us([&](int, cudaStream_t s) { argmax(params(0), s); });
    const float am_old =
        per_launch_us([&](int, cudaStream_t s) { argmax_single_cta(params(0), s); });
    const float am_new_rot = per_launch_us([&](int i, cudaStream_t s) { argmax(params(i), s); });
    const float am_old_rot =
        per_launch_us([&](int i, cudaStream_t s) { argmax_single_cta(params(i), s); });
    const double floor_us = double(T) * kVocab * 4 / 4.3e12 * 1e6;
    std::printf("%6d | %11.2f %16.2f | %8.2f | %15.2f %5.2f | %16.2f %5.2f  (%.2f)\n", T, route_new,
                route_old, fin, am_new, am_old, am_new_rot, am_old_rot, floor_us);
  }
}

// The map builders above the few-token sizes (prefill and large decode batches): one 1024-thread
// CTA vs the two multi-CTA kernels over chunks of pairs, top-k included, at the latency tile (8)
// and the throughput tile (128).
TEST(MoeSmallKernelsBench, DISABLED_RoutingMaps) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  std::printf(
      "µs per routing (top-k + maps), %d back to back in one CUDA graph\n"
      "tokens | tile 8: one CTA  chunks | tile 128: one CTA  chunks\n",
      kLaunches);
  for (int T : {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}) {
    float us[2][2];
    for (int i = 0; i < 2; ++i) {
      Routing r(T, i == 0 ? 8 : 128);
      us[i][0] = per_launch_us(
          [&](int, cudaStream_t s) { moe_routing(r.p, s, MoeMapsKernel::kSingleCta); });
      us[i][1] =
          per_launch_us([&](int, cudaStream_t s) { moe_routing(r.p, s, MoeMapsKernel::kChunked); });
    }
    std::printf("%6d | %15.2f %6.2f | %17.2f %6.2f\n", T, us[0][0], us[0][1], us[1][0], us[1][1]);
  }
}

}  // namespace
}  // namespace serval::kernels::cuda
