#include "base/abortable_barrier.h"

#include <utility>

#include "base/error.h"

namespace serval {

AbortableBarrier::AbortableBarrier(int count, std::string aborted_message)
    : count_(count), aborted_message_(std::move(aborted_message)) {
  if (count < 1) throw InvalidArgument("AbortableBarrier: count must be at least 1");
}

void AbortableBarrier::arrive_and_wait() {
  std::unique_lock lock(mu_);
  if (aborted_) throw Error(aborted_message_);
  const uint64_t round = round_;
  if (++arrived_ == count_) {
    arrived_ = 0;
    ++round_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return round_ != round || aborted_; });
  if (round_ == round) throw Error(aborted_message_);
}

void AbortableBarrier::abort() {
  {
    std::lock_guard lock(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
}

}  // namespace serval
