// A reusable barrier for a fixed number of threads that can be aborted: abort() releases every
// waiter (present and future) with serval::Error, so a thread whose peer failed does not wait
// forever. Used by the tensor-parallel ranks of one process (runtime/parallel_runner.cpp) and the
// in-process CPU communicator.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

namespace serval {

class AbortableBarrier {
 public:
  // `aborted_message`: the text of the Error an aborted barrier throws.
  explicit AbortableBarrier(int count,
                            std::string aborted_message = "barrier aborted: a peer thread failed");
  AbortableBarrier(const AbortableBarrier&) = delete;
  AbortableBarrier& operator=(const AbortableBarrier&) = delete;

  // Returns once `count` threads have arrived in this round (then the next round starts); throws
  // serval::Error if the barrier is or becomes aborted.
  void arrive_and_wait();
  // Makes every current and later arrive_and_wait throw. Idempotent, from any thread.
  void abort();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int count_;
  const std::string aborted_message_;
  int arrived_ = 0;
  uint64_t round_ = 0;
  bool aborted_ = false;
};

}  // namespace serval
