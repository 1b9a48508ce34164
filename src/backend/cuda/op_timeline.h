// SERVAL_OP_TIMELINE=1: where the GPU time of a step goes while it runs as it normally does (CUDA
// graphs, programmatic dependent launch), which kernel-serializing profilers cannot show. After
// every outermost backend op (and at the start of the step) a probe kernel stores the GPU clock
// once the work before it has completed (kernels/cuda/misc/timeline_probe.h); the time between
// two marks is charged to the op that ends at the second one, keyed by the op and the op before it
// ("rms_norm > quantized_linear" is a layer's q/k/v projection). Each probe adds about half a
// microsecond to the step. At the end of each step the marks are read back (a host wait); the
// table of µs per step goes to the log when the backend is destroyed.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace serval::backend::cuda {

class OpTimeline {
 public:
  OpTimeline();  // enabled by SERVAL_OP_TIMELINE=1
  ~OpTimeline();
  OpTimeline(const OpTimeline&) = delete;
  OpTimeline& operator=(const OpTimeline&) = delete;

  bool enabled() const { return enabled_; }
  // Starts a step's marks: slot 0, "start" (also at the start of a graph capture).
  void restart(cudaStream_t stream);
  // A mark after op `op` (a string literal), or nothing past the slot capacity. Never throws (it
  // runs in OpScope's destructor): a failed probe launch turns the timeline off with a warning.
  void mark(const char* op, cudaStream_t stream) noexcept;
  // The marks made since restart, for a graph captured over them: its replays write the same
  // slots, and adopt() makes them this step's marks.
  std::vector<const char*> take_marks();
  void adopt(const std::vector<const char*>& marks) { marks_ = marks; }
  // Reads the step's marks back (waits for the stream) and adds them up; clears them.
  void collect(cudaStream_t stream);
  // Steps collected, and the mean µs per step charged to `key` ("a > b"; −1 if never seen).
  long steps() const { return steps_; }
  double us_per_step(const std::string& key) const;

 private:
  struct Total {
    double us = 0;
    long calls = 0;
  };
  bool enabled_ = false;
  uint64_t* slots_ = nullptr;  // device [kSlots]
  std::vector<const char*> marks_;
  std::vector<uint64_t> host_;
  std::map<std::string, Total> totals_;
  long steps_ = 0;
  double step_us_ = 0;
};

}  // namespace serval::backend::cuda
