#include "kernels/cuda/misc/timeline_probe.h"

#include <atomic>
#include <map>
#include <mutex>

#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

__global__ void timeline_probe_kernel(uint64_t* slot) {
  pdl_launch_dependents();
  pdl_wait();
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  *slot = now;
}

struct Sink {
  TimelineSink fn;
  void* ctx;
};
std::mutex g_sinks_mu;
std::map<cudaStream_t, Sink> g_sinks;  // guarded by g_sinks_mu
std::atomic<int> g_sink_count{0};      // g_sinks.size(), read without the lock

}  // namespace

void add_timeline_sink(cudaStream_t stream, TimelineSink sink, void* ctx) {
  std::lock_guard lock(g_sinks_mu);
  g_sinks[stream] = {sink, ctx};
  g_sink_count = int(g_sinks.size());
}

void remove_timeline_sinks(void* ctx) {
  std::lock_guard lock(g_sinks_mu);
  std::erase_if(g_sinks, [ctx](const auto& entry) { return entry.second.ctx == ctx; });
  g_sink_count = int(g_sinks.size());
}

void timeline_mark(const char* what, cudaStream_t stream) {
  if (g_sink_count.load(std::memory_order_relaxed) == 0) return;
  Sink sink{};
  {
    std::lock_guard lock(g_sinks_mu);
    const auto it = g_sinks.find(stream);
    if (it == g_sinks.end()) return;
    sink = it->second;
  }
  sink.fn(sink.ctx, what, stream);
}

void timeline_probe(uint64_t* slot, cudaStream_t stream) {
  launch_pdl("timeline_probe", timeline_probe_kernel, dim3(1), dim3(1), 0, stream, slot);
}

}  // namespace serval::kernels::cuda
