#include "base/abortable_barrier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "base/error.h"

namespace serval {
namespace {

// Every round releases its threads only once all have arrived: a thread that passed round r saw
// every thread's arrival count of round r.
TEST(AbortableBarrier, RoundsReleaseTogether) {
  constexpr int kThreads = 4, kRounds = 200;
  AbortableBarrier barrier(kThreads);
  std::atomic<int> arrivals{0};
  std::atomic<bool> early{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) {
        arrivals.fetch_add(1);
        barrier.arrive_and_wait();
        if (arrivals.load() < (r + 1) * kThreads) early = true;
        barrier.arrive_and_wait();  // nobody starts round r + 1 before all checked round r
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_FALSE(early.load());
  EXPECT_EQ(arrivals.load(), kThreads * kRounds);
}

TEST(AbortableBarrier, AbortReleasesWaitersAndLaterCalls) {
  AbortableBarrier barrier(2);
  std::atomic<bool> threw{false};
  std::thread waiter([&] {
    try {
      barrier.arrive_and_wait();  // its peer never comes
    } catch (const Error&) {
      threw = true;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  barrier.abort();
  waiter.join();
  EXPECT_TRUE(threw.load());
  EXPECT_THROW(barrier.arrive_and_wait(), Error);
}

TEST(AbortableBarrier, OneThreadNeverWaitsAndZeroIsRejected) {
  AbortableBarrier one(1);
  one.arrive_and_wait();
  one.arrive_and_wait();
  EXPECT_THROW(AbortableBarrier(0), InvalidArgument);
}

}  // namespace
}  // namespace serval
