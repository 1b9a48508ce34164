#include "runtime/output_queue.h"

#include <exception>
#include <utility>

#include "base/log.h"

namespace serval::runtime {

OutputQueue::OutputQueue() : thread_([this] { run(); }) {}

OutputQueue::~OutputQueue() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void OutputQueue::push(std::shared_ptr<const OutputCallback> callback, RequestOutput output) {
  {
    std::lock_guard lock(mu_);
    items_.push_back({std::move(callback), std::move(output)});
  }
  cv_.notify_one();
}

void OutputQueue::drain() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return items_.empty() && !delivering_; });
}

void OutputQueue::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
    if (items_.empty()) break;  // stop_ and nothing left to deliver
    Item item = std::move(items_.front());
    items_.pop_front();
    delivering_ = true;
    lock.unlock();
    try {
      (*item.callback)(item.output);
    } catch (const std::exception& e) {
      // A callback that throws loses only its own update; the others are still delivered.
      log::error("output callback of request {} failed: {}", item.output.request_id, e.what());
    }
    lock.lock();
    delivering_ = false;
    if (items_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace serval::runtime
