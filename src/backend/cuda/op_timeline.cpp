#include "backend/cuda/op_timeline.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "backend/cuda/cuda_check.h"
#include "base/log.h"
#include "kernels/cuda/misc/timeline_probe.h"

namespace serval::backend::cuda {

namespace {
constexpr size_t kSlots = 8192;  // marks per step (a 94-layer MoE model makes ~1000)
}  // namespace

OpTimeline::OpTimeline() {
  const char* env = std::getenv("SERVAL_OP_TIMELINE");
  enabled_ = env != nullptr && std::strcmp(env, "1") == 0;
  if (!enabled_) return;
  cuda_check(cudaMalloc(reinterpret_cast<void**>(&slots_), kSlots * sizeof(uint64_t)),
             "op timeline slots");
  host_.resize(kSlots);
}

OpTimeline::~OpTimeline() {
  if (slots_) cudaFree(slots_);
  if (!enabled_) return;
  kernels::cuda::remove_timeline_sinks(this);
  log_table("CUDA graph steps", graph_);
  log_table("eager steps (prefills, warm-ups and their one-time tuning)", eager_);
}

void OpTimeline::log_table(const char* what, const Table& t) {
  if (t.steps == 0) return;
  std::vector<std::pair<std::string, Total>> rows(t.totals.begin(), t.totals.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  const double steps = double(t.steps);
  log::info(
      "GPU timeline of {} {} (an op is charged the time since the op before it ended): {:.1f} "
      "us per step",
      t.steps, what, t.step_us / steps);
  for (const auto& [key, total] : rows)
    log::info("  {:<40} {:>10.1f} us/step {:>6.1f} % {:>8.1f} calls/step {:>8.2f} us/call", key,
              total.us / steps, 100.0 * total.us / t.step_us, double(total.calls) / steps,
              total.us / double(total.calls));
}

double OpTimeline::us_per_step(Steps kind, const std::string& key) const {
  const Table& t = table(kind);
  const auto it = t.totals.find(key);
  return it == t.totals.end() || t.steps == 0 ? -1.0 : it->second.us / double(t.steps);
}

void OpTimeline::restart(cudaStream_t stream) {
  if (!enabled_) return;
  // Marks on this stream (timeline_mark: ops and sub-ops) come here.
  kernels::cuda::add_timeline_sink(
      stream,
      [](void* self, const char* what, cudaStream_t s) {
        static_cast<OpTimeline*>(self)->mark(what, s);
      },
      this);
  marks_.clear();
  replayed_ = false;
  mark("start", stream);
}

void OpTimeline::mark(const char* op, cudaStream_t stream) noexcept {
  if (!enabled_ || marks_.size() >= kSlots) return;
  try {
    kernels::cuda::timeline_probe(slots_ + marks_.size(), stream);
  } catch (const std::exception& e) {  // called from destructors: never throws
    log::warn("op timeline off: {}", e.what());
    enabled_ = false;
    return;
  }
  marks_.push_back(op);
}

std::vector<const char*> OpTimeline::take_marks() {
  std::vector<const char*> out;
  out.swap(marks_);
  return out;
}

void OpTimeline::collect(cudaStream_t stream) {
  if (!enabled_ || marks_.size() < 2) {
    marks_.clear();
    return;
  }
  cuda_check(cudaMemcpyAsync(host_.data(), slots_, marks_.size() * sizeof(uint64_t),
                             cudaMemcpyDeviceToHost, stream),
             "op timeline read-back");
  cuda_check(cudaStreamSynchronize(stream), "op timeline read-back");
  Table& table = replayed_ ? graph_ : eager_;
  for (size_t i = 1; i < marks_.size(); ++i) {
    const double us = double(int64_t(host_[i] - host_[i - 1])) * 1e-3;
    Total& t = table.totals[std::string(marks_[i - 1]) + " > " + marks_[i]];
    t.us += us;
    ++t.calls;
  }
  table.step_us += double(int64_t(host_[marks_.size() - 1] - host_[0])) * 1e-3;
  ++table.steps;
  marks_.clear();
}

}  // namespace serval::backend::cuda
