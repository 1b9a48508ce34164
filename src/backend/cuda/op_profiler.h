// SERVAL_PROFILE_OPS=1: GPU time of each CUDA backend op (linear, attention, moe, ...), from CUDA
// events recorded around every call in eager steps; graph captures and replays are not timed.
// Times are inclusive (moe includes its router linear). The table goes to the log when the
// backend is destroyed. A fallback for machines where Nsight Compute cannot read counters.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "base/log.h"
#include "kernels/cuda/misc/timeline_probe.h"

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
  // What the backend's thread is in now (an op's name, "synchronize", ...; null between calls),
  // kept whether or not timing is enabled: read from other threads when a parallel step stalls.
  const char* activity() const { return activity_.load(std::memory_order_relaxed); }
  // Sets the activity and returns the one it replaces (scopes nest: restore it at the end).
  const char* swap_activity(const char* a) {
    return activity_.exchange(a, std::memory_order_relaxed);
  }

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
  std::atomic<const char*> activity_{nullptr};
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::map<std::string, Total> totals_;
};

// RAII: `what` is the backend's activity for the scope (OpProfiler::activity), e.g. a wait for
// the GPU; the activity before it comes back at the end.
class ActivityScope {
 public:
  ActivityScope(OpProfiler& p, const char* what) : p_(p), outer_(p.swap_activity(what)) {}
  ~ActivityScope() { p_.swap_activity(outer_); }
  ActivityScope(const ActivityScope&) = delete;
  ActivityScope& operator=(const ActivityScope&) = delete;
  // No scope was open around this one.
  bool outermost() const { return outer_ == nullptr; }

 private:
  OpProfiler& p_;
  const char* outer_;
};

// RAII: the op is the backend's activity while it is enqueued (ActivityScope); it is timed when
// the profiler is enabled and no graph is being captured, and an outermost op marks its stream's
// timeline when there is one (kernels::cuda::timeline_mark). With SERVAL_LOG_LEVEL=trace it also
// logs the op's start and end on the host, with the GPU: where a rank's thread stops when a
// parallel group hangs.
class OpScope {
 public:
  OpScope(OpProfiler& p, const char* op, cudaStream_t stream, bool capturing)
      : activity_(p, op),
        owner_(p),
        p_(p.enabled() && !capturing ? &p : nullptr),
        stream_(stream),
        op_(op),
        trace_(log::tracing()) {
    if (trace_) trace_op("enqueueing");
    if (p_) p_->begin(op, stream_);
  }
  ~OpScope() {
    if (p_) p_->end(stream_);
    if (trace_) trace_op("enqueued");
    if (activity_.outermost()) kernels::cuda::timeline_mark(op_, stream_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  void trace_op(const char* what) const {
    int device = -1;
    (void)cudaGetDevice(&device);
    log::trace("GPU {}: {} {}", device, what, op_);
  }

  ActivityScope activity_;
  OpProfiler& owner_;
  OpProfiler* p_;
  cudaStream_t stream_;
  const char* op_;
  const bool trace_;  // SERVAL_LOG_LEVEL=trace
};

}  // namespace serval::backend::cuda
