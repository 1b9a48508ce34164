// SERVAL_OP_TIMELINE=1: where the GPU time of a step goes while it runs as it normally does (CUDA
// graphs, programmatic dependent launch), which kernel-serializing profilers cannot show. After
// every outermost backend op (and at the start of the step) a probe kernel stores the GPU clock
// once the work before it has completed (kernels/cuda/misc/timeline_probe.h); the time between
// two marks is charged to the op that ends at the second one, keyed by the op and the op before it
// ("rms_norm > quantized_linear" is a layer's q/k/v projection). Each probe adds about half a
// microsecond to the step. At the end of each step the marks are read back (a host wait). Steps
// replayed from a CUDA graph and eager steps (prefills, warm-ups with their one-time tuning) are
// added up apart; both tables of µs per step go to the log when the backend is destroyed.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace serval::backend::cuda {

class OpTimeline {
 public:
  enum class Steps { kGraph, kEager };  // replayed from a CUDA graph, or launched op by op

  OpTimeline();  // enabled by SERVAL_OP_TIMELINE=1
  ~OpTimeline();
  OpTimeline(const OpTimeline&) = delete;
  OpTimeline& operator=(const OpTimeline&) = delete;

  bool enabled() const { return enabled_; }
  // Starts a step's marks: slot 0, "start" (also at the start of a graph capture). Registers this
  // timeline as the stream's sink of marks (timeline_mark of kernels/cuda/misc/timeline_probe.h,
  // called by every outermost op and between an op's kernels) until it is destroyed.
  void restart(cudaStream_t stream);
  // A mark after op `op` (a string literal), or nothing past the slot capacity. Never throws (it
  // runs in OpScope's destructor): a failed probe launch turns the timeline off with a warning.
  void mark(const char* op, cudaStream_t stream) noexcept;
  // The marks made since restart, for a graph captured over them: its replays write the same
  // slots, and adopt() makes them this step's marks (and the step a graph step).
  std::vector<const char*> take_marks();
  void adopt(const std::vector<const char*>& marks) {
    marks_ = marks;
    replayed_ = true;
  }
  // Reads the step's marks back (waits for the stream) and adds them up; clears them.
  void collect(cudaStream_t stream);
  // Steps of a kind collected, and their mean µs per step charged to `key` ("a > b"; −1 if never
  // seen).
  long steps(Steps kind) const { return table(kind).steps; }
  double us_per_step(Steps kind, const std::string& key) const;

 private:
  struct Total {
    double us = 0;
    long calls = 0;
  };
  struct Table {
    std::map<std::string, Total> totals;
    long steps = 0;
    double step_us = 0;
  };
  const Table& table(Steps kind) const { return kind == Steps::kGraph ? graph_ : eager_; }
  static void log_table(const char* what, const Table& t);

  bool enabled_ = false;
  uint64_t* slots_ = nullptr;  // device [kSlots]
  std::vector<const char*> marks_;
  bool replayed_ = false;  // this step's marks came from a graph replay
  std::vector<uint64_t> host_;
  Table graph_, eager_;
};

}  // namespace serval::backend::cuda
