// SERVAL_PROFILE_OPS=1: GPU time of each CUDA backend op (linear, attention, moe, ...), from CUDA
// events recorded around every call in eager steps; graph captures and replays are not timed.
// Times are inclusive (moe includes its router linear). The table goes to the log when the
// backend is destroyed. A fallback for machines where Nsight Compute cannot read counters.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

#include "base/log.h"

namespace serval::backend::cuda {

class OpProfiler {
 public:
  OpProfiler();
  ~OpProfiler();  // logs the table (when enabled and anything was timed)
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  bool enabled() const { return enabled_; }
  // Events around one op call on `stream`.
  void begin(const char* op, cudaStream_t stream);
  void end(cudaStream_t stream);
  // Waits for the recorded ops and adds their times up (call outside graph capture).
  void collect(cudaStream_t stream);

 private:
  struct Pending {
    const char* op;
    cudaEvent_t start, stop;
  };
  std::vector<size_t> open_;  // indices into pending_ of ops begun and not ended (scopes nest)
  struct Total {
    double ms = 0;
    long calls = 0;
  };
  cudaEvent_t take_event();

  bool enabled_ = false;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::map<std::string, Total> totals_;
};

// RAII: times one op when the profiler is enabled and no graph is being captured. With
// SERVAL_LOG_LEVEL=trace it also logs the op's start and end on the host, with the GPU: where a
// rank's thread stops when a parallel group hangs.
class OpScope {
 public:
  OpScope(OpProfiler& p, const char* op, cudaStream_t stream, bool capturing)
      : p_(p.enabled() && !capturing ? &p : nullptr), stream_(stream) {
    if (log::tracing()) trace_ = op;
    if (trace_) trace_op("enqueueing");
    if (p_) p_->begin(op, stream_);
  }
  ~OpScope() {
    if (p_) p_->end(stream_);
    if (trace_) trace_op("enqueued");
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  void trace_op(const char* what) const {
    int device = -1;
    (void)cudaGetDevice(&device);
    log::trace("GPU {}: {} {}", device, what, trace_);
  }

  OpProfiler* p_;
  cudaStream_t stream_;
  const char* trace_ = nullptr;  // the op's name while tracing
};

}  // namespace serval::backend::cuda
