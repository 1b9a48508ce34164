// Shared pieces of the decode-GEMM benchmarks (QuantGemmBench, Bf16GemvBench): the model
// shapes they time and a graph timer over weight copies larger than L2.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/bench_timing.h"

namespace serval::testing {

constexpr double kCopyTbPerS = 4.3;  // H200 device-to-device copy bandwidth (PERF.md)

struct BenchShape {
  const char* name;
  int n, k;  // y[m, n] = x[m, k] · W[n, k]ᵀ
};

inline constexpr BenchShape kDecodeGemmShapes[] = {
    {"qwen3-30b qkv", 5120, 2048},       {"qwen3-30b o", 2048, 4096},
    {"qwen3-0.6b qkv", 4096, 1024},      {"qwen3-0.6b o", 1024, 2048},
    {"qwen3-0.6b gate_up", 6144, 1024},  {"qwen3-0.6b down", 1024, 3072},
    {"llama-70b qkv", 10240, 8192},      {"llama-70b o", 8192, 8192},
    {"llama-70b gate_up", 57344, 8192},  {"llama-70b down", 8192, 28672},
    {"llama-70b lm_head", 128256, 8192}, {"qwen3-30b lm_head", 151936, 2048},
};

inline constexpr int kDecodeGemmMs[] = {1, 8, 16, 64};

// Weight copies for graph_us: enough that one pass over them (~256 MB) cannot stay in the 50 MB
// L2, as in a decode step where every layer reads different weights.
inline int cold_copies(size_t weight_bytes) {
  return int(std::clamp<size_t>((size_t(256) << 20) / std::max<size_t>(weight_bytes, 1), 1, 16));
}

// Median µs per call of run(stream, copy) when `calls` calls, cycling over copy = 0..copies-1,
// are captured in one CUDA graph and replayed (5 timed replays).
template <typename F>
double cold_graph_us(int copies, F&& run, int calls = 48) {
  return graph_us(
      [&](cudaStream_t s) {
        for (int i = 0; i < calls; ++i) run(s, i % copies);
      },
      calls, 5);
}

}  // namespace serval::testing
