// A fixed pool of worker threads and a blocking parallel_for over an index range.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace serval {

class ThreadPool {
 public:
  // num_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n); the caller's thread takes part.
  // Chunks hold at least `min_chunk` indices. Not reentrant: do not call from inside fn.
  void parallel_for(int64_t n, int64_t min_chunk,
                    const std::function<void(int64_t begin, int64_t end)>& fn);

  // The process-wide pool used by CPU kernels: SERVAL_CPU_THREADS threads (1..4096, base/env.h),
  // else one per hardware thread.
  static ThreadPool& global();

 private:
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex call_mu_;  // serializes parallel_for callers
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1, next_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace serval
