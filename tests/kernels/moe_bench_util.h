// The Qwen3-layer MoE benchmark shared by the bf16 and NVFP4 expert tests (DISABLED_ gtests):
// per token count and backend, eager time (one layer per call, launch overhead included) and graph
// time (kGraphLayers layers with different inputs, hence mostly different experts, in one CUDA
// graph, as a decode step runs them; per-layer time), GB/s and % of the byte floor (the distinct
// experts' bytes averaged over the layers, plus x and out, at 4.3 TB/s), and the crossover.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/moe/moe_cuda.h"
#include "kernels/bench_timing.h"
#include "kernels/cpu/ops.h"
#include "kernels/moe_test_util.h"

namespace serval::testing::moe_util {

// Distinct experts that `tokens` rows of router logits [tokens, experts] select (softmax top-k).
inline int distinct_experts(const std::vector<float>& logits, int tokens, int experts, int top_k) {
  std::vector<int32_t> ids(size_t(tokens) * top_k);
  std::vector<float> w(ids.size());
  kernels::RouterParams rp{logits.data(), nullptr, ids.data(), w.data(),
                           tokens,        experts, top_k,      kernels::RoutingMethod::kSoftmaxTopK,
                           true};
  kernels::cpu::route(rp);
  std::vector<bool> hit(size_t(experts), false);
  for (int32_t e : ids) hit[size_t(e)] = true;
  return int(std::count(hit.begin(), hit.end(), true));
}

// The layer's calls at T = 1, 2, 4 … 8192 tokens (softmax top-k, renormalized; inputs seeded
// 4242 + T + 7919·i for graph layer i) on both backends. expert_bytes: one expert's weight bytes.
inline void benchmark_moe_layer(const char* title, double expert_bytes, const MoeTestLayer& l) {
  const int hidden = l.s.hidden, experts = l.s.experts, top_k = l.s.top_k;
  constexpr MoeCudaBackend kBackends[] = {MoeCudaBackend::kLatency, MoeCudaBackend::kThroughput};
  constexpr int kGraphLayers = 8, kGraphMaxTokens = 256;
  int crossover = -1;
  std::printf(
      "%s; graph = %d different layers' inputs in one CUDA graph, per layer\n"
      "tokens  distinct  floor_us |   latency eager  graph us   GB/s %%floor | throughput "
      "eager  graph us   GB/s %%floor\n",
      title, kGraphLayers);
  for (int T = 1; T <= 8192; T *= 2) {
    const int layers = T <= kGraphMaxTokens ? kGraphLayers : 1;
    std::vector<std::unique_ptr<MoeCall>> calls;
    double distinct = 0;
    for (int i = 0; i < layers; ++i) {
      calls.push_back(std::make_unique<MoeCall>(l, T, unsigned(4242 + T + 7919 * i)));
      distinct += distinct_experts(calls.back()->logits, T, experts, top_k) / double(layers);
    }
    const double bytes = distinct * expert_bytes + 2.0 * T * hidden * 2;
    const double floor_us = bytes / 4.3e12 * 1e6;
    double eager[2], graph[2];
    for (int b = 0; b < 2; ++b) {
      std::vector<MoeCudaArgs> args;
      for (auto& c : calls) args.push_back(c->args(l, kBackends[b]));
      eager[b] = median_us([&] { moe_forward_cuda(args[0], nullptr); }, 50);
      graph[b] = graph_us(
          [&](cudaStream_t s) {
            for (const MoeCudaArgs& a : args) moe_forward_cuda(a, s);
          },
          layers, 30);
    }
    if (crossover < 0 && graph[1] < graph[0]) crossover = T;
    std::printf("%6d  %8.1f  %8.2f | %15.2f %9.2f %6.0f %5.0f%% | %16.2f %9.2f %6.0f %5.0f%%\n", T,
                distinct, floor_us, eager[0], graph[0], bytes / graph[0] / 1e3,
                100.0 * floor_us / graph[0], eager[1], graph[1], bytes / graph[1] / 1e3,
                100.0 * floor_us / graph[1]);
  }
  std::printf("crossover (throughput faster in a graph from): %d tokens\n", crossover);
}

}  // namespace serval::testing::moe_util
