// CUDA-event timers of the kernel benchmarks (DISABLED_ gtests, run on the GPU machine).
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda_test_util.h"

namespace serval::testing {

// Median µs of one `launch()` on the legacy stream, each call timed alone (its launch cost
// included), after 3 warm-up calls.
template <typename F>
double median_us(F&& launch, int iters = 20) {
  for (int i = 0; i < 3; ++i) launch();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> times;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cuda_check(cudaEventSynchronize(b), "timed launch");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    times.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3;
}

// Median µs of one replay of a CUDA graph holding what `enqueue(stream)` enqueues, divided by
// `per_replay` (the launches or layers inside): how a decode step runs, without launch gaps and
// with kernels chained by programmatic dependent launch. One eager `enqueue` first (kernel
// attributes and library plans are set up outside the capture), then 2 warm-up replays.
template <typename Enqueue>
double graph_us(Enqueue&& enqueue, int per_replay = 1, int replays = 20) {
  cudaStream_t s;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  enqueue(s);
  cuda_check(cudaStreamSynchronize(s), "eager warm-up");
  cudaGraph_t graph;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  enqueue(s);
  cuda_check(cudaStreamEndCapture(s, &graph), "end capture");
  cudaGraphExec_t exec;
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < 2; ++i) cuda_check(cudaGraphLaunch(exec, s), "warm-up replay");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> times;
  for (int i = 0; i < replays; ++i) {
    cudaEventRecord(a, s);
    cuda_check(cudaGraphLaunch(exec, s), "replay");
    cudaEventRecord(b, s);
    cuda_check(cudaEventSynchronize(b), "replay");
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
  return times[times.size() / 2] * 1e3 / per_replay;
}

}  // namespace serval::testing
