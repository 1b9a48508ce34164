#include "base/thread_pool.h"

#include <algorithm>

#include "base/env.h"

namespace serval {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(env_int("SERVAL_CPU_THREADS", 1, 4096, 0));
  return pool;
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  if (workers_.empty() || n <= min_chunk) {
    fn(0, n);
    return;
  }
  std::lock_guard call_lock(call_mu_);
  int64_t chunk = std::max(min_chunk, n / (int64_t(num_threads()) * 4));
  {
    std::lock_guard lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_ = 0;
    pending_ = int(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  for (;;) {
    int64_t begin;
    {
      std::lock_guard lock(mu_);
      begin = next_;
      next_ += chunk_;
    }
    if (begin >= n) break;
    fn(begin, std::min(n, begin + chunk));
  }
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock lock(mu_);
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* fn = fn_;
    for (;;) {
      int64_t begin = next_;
      next_ += chunk_;
      if (begin >= n_) break;
      int64_t end = std::min(n_, begin + chunk_);
      lock.unlock();
      (*fn)(begin, end);
      lock.lock();
    }
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

}  // namespace serval
