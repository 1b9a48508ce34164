// ThreadPool: parallel_for covers its range once, in chunks.
#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace serval {
namespace {

TEST(ThreadPool, ParallelForCoversTheRangeOnce) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.num_threads(), 3);
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000)}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 4, [&](int64_t begin, int64_t end) {
      EXPECT_LE(0, begin);
      EXPECT_LT(begin, end);
      EXPECT_LE(end, n);
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "index " << i;
  }
}

}  // namespace
}  // namespace serval
