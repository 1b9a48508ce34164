#include "backend/cuda/op_profiler.h"

#include <algorithm>
#include <cstdlib>

#include "base/log.h"

namespace serval::backend::cuda {

OpProfiler::OpProfiler() {
  const char* env = std::getenv("SERVAL_PROFILE_OPS");
  enabled_ = env != nullptr && std::string(env) == "1";
}

OpProfiler::~OpProfiler() {
  if (!enabled_) return;
  for (const Pending& p : pending_) {
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.stop);
  }
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  if (totals_.empty()) return;
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double all = 0;
  for (const auto& [op, t] : rows) all += t.ms;
  log::info("GPU time per backend op (eager steps, inclusive), total {:.3f} ms:", all);
  for (const auto& [op, t] : rows)
    log::info("  {:<18} {:>10.3f} ms {:>6.1f} % {:>9} calls {:>9.2f} us/call", op, t.ms,
              100.0 * t.ms / all, t.calls, 1e3 * t.ms / double(t.calls));
}

cudaEvent_t OpProfiler::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  cudaEventCreate(&e);
  return e;
}

void OpProfiler::begin(const char* op, cudaStream_t stream) {
  if (open_.empty() && pending_.size() >= 4096) collect(stream);  // bound the events in flight
  Pending p{op, take_event(), take_event()};
  cudaEventRecord(p.start, stream);
  open_.push_back(pending_.size());
  pending_.push_back(p);
}

void OpProfiler::end(cudaStream_t stream) {
  if (open_.empty()) return;
  cudaEventRecord(pending_[open_.back()].stop, stream);
  open_.pop_back();
}

void OpProfiler::collect(cudaStream_t stream) {
  if (!enabled_ || !open_.empty() || pending_.empty()) return;
  if (cudaStreamSynchronize(stream) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  for (const Pending& p : pending_) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, p.start, p.stop) == cudaSuccess) {
      Total& t = totals_[p.op];
      t.ms += ms;
      ++t.calls;
    } else {
      cudaGetLastError();
    }
    free_events_.push_back(p.start);
    free_events_.push_back(p.stop);
  }
  pending_.clear();
}

}  // namespace serval::backend::cuda
