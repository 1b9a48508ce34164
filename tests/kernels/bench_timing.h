// CUDA-event timers of the kernel benchmarks (DISABLED_ gtests, run on the GPU machine).
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda_test_util.h"

namespace serval::testing {

// Median ms of `iters` calls of `run()`, each bracketed by CUDA events on `stream`.
template <typename F>
float median_event_ms(cudaStream_t stream, F&& run, int iters) {
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&b), "event");
  std::vector<float> times;
  for (int i = 0; i < iters; ++i) {
    cuda_check(cudaEventRecord(a, stream), "record");
    run();
    cuda_check(cudaEventRecord(b, stream), "record");
    cuda_check(cudaEventSynchronize(b), "timed run");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    times.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Median µs of one `launch()` on the legacy stream, each call timed alone (its launch cost
// included), after 3 warm-up calls.
template <typename F>
double median_us(F&& launch, int iters = 20) {
  for (int i = 0; i < 3; ++i) launch();
  return median_event_ms(nullptr, launch, iters) * 1e3;
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
  double us = 0;
  {
    const CapturedGraph graph(s, enqueue);
    for (int i = 0; i < 2; ++i) graph.launch(s);
    us = median_event_ms(
             s, [&] { graph.launch(s); }, replays) *
         1e3 / per_replay;
  }
  cudaStreamDestroy(s);
  return us;
}

}  // namespace serval::testing
