// Shared pieces of the decode-GEMM benchmarks (QuantGemmBench, Bf16GemvBench): the model
// shapes they time and a CUDA-event median timer.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

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
    {"llama-70b lm_head", 128256, 8192},
};

inline constexpr int kDecodeGemmMs[] = {1, 8, 16, 64};

// Median µs of `run` on the legacy stream after 5 warm-up calls (20 timed calls).
template <typename F>
double median_us(F&& run) {
  for (int i = 0; i < 5; ++i) run();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> times;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(a);
    run();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    times.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3;
}

// Weight copies for graph_us: enough that one pass over them (~256 MB) cannot stay in the 50 MB
// L2, as in a decode step where every layer reads different weights.
inline int cold_copies(size_t weight_bytes) {
  return int(std::clamp<size_t>((size_t(256) << 20) / std::max<size_t>(weight_bytes, 1), 1, 16));
}

// Median µs per call of run(stream, copy) when `calls` calls, cycling over copy = 0..copies-1,
// are captured in one CUDA graph and replayed (5 timed replays after one warm-up): no launch gaps,
// as in a graph-captured decode step.
template <typename F>
double graph_us(int copies, F&& run, int calls = 48) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < copies; ++i) run(s, i);  // lazy initialisation outside the capture
  cudaStreamSynchronize(s);
  cudaGraph_t graph;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < calls; ++i) run(s, i % copies);
  cudaStreamEndCapture(s, &graph);
  cudaGraphExec_t exec;
  cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphLaunch(exec, s);
  cudaStreamSynchronize(s);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> times;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(exec, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    times.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3 / calls;
}

}  // namespace serval::testing
