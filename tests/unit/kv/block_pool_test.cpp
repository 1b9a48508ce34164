#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "base/error.h"

namespace serval::kv {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

uint64_t constant_hash(uint64_t, std::span<const int32_t>) {
  return 42;
}

TEST(BlockPool, AllocateIsAllOrNothingAndRefCounts) {
  BlockPool pool(4, 2);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{0, 1, 2, 3}));
  std::vector<int32_t> got;
  EXPECT_FALSE(pool.allocate(5, got));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(pool.num_free(), 4);
  ASSERT_TRUE(pool.allocate(3, got));
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.num_free(), 1);
  for (int32_t b : got) EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_FALSE(pool.allocate(2, got));
  EXPECT_EQ(got.size(), 3u);
  pool.ref(1);
  EXPECT_EQ(pool.ref_count(1), 2);
  pool.unref(1);
  EXPECT_EQ(pool.num_free(), 1);
  pool.unref(1);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_THROW(pool.unref(1), Error);  // already at 0
  EXPECT_THROW(pool.ref_count(4), Error);
  EXPECT_THROW(BlockPool(0, 16), InvalidArgument);
}

TEST(BlockPool, UncachedBlocksAreReusedFirstCachedOnesInLruOrder) {
  BlockPool pool(6, 2);
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.allocate(6, b));
  pool.cache(0, 100, -1, iota_tokens(2, 0));
  pool.cache(1, 101, -1, iota_tokens(2, 10));
  pool.cache(2, 102, -1, iota_tokens(2, 20));
  // Free order: cached 1, uncached 3, cached 0, uncached 4, cached 2 (5 stays held).
  for (int32_t id : {1, 3, 0, 4, 2}) pool.unref(id);
  // Uncached at the head (latest first), cached at the tail in the order they were freed.
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{4, 3, 1, 0, 2}));
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(3, got));
  EXPECT_EQ(got, (std::vector<int32_t>{4, 3, 1}));
  // Block 1 was evicted: its entry is gone; 0 and 2 are still revivable.
  EXPECT_FALSE(pool.is_cached(1));
  EXPECT_EQ(pool.find_cached(101, -1, iota_tokens(2, 10)), -1);
  EXPECT_EQ(pool.find_cached(100, -1, iota_tokens(2, 0)), 0);
  EXPECT_EQ(pool.num_cached(), 2);
}

TEST(BlockPool, HitRevivesAFreedCachedBlock) {
  BlockPool pool(3, 4);
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.allocate(1, b));
  ASSERT_EQ(pool.cache(0, 7, -1, iota_tokens(4, 5)), 0);
  pool.unref(0);
  EXPECT_EQ(pool.num_free(), 3);
  int32_t hit = pool.find_cached(7, -1, iota_tokens(4, 5));
  ASSERT_EQ(hit, 0);
  pool.ref(hit);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(pool.is_cached(0));
}

TEST(BlockPool, HitsAreVerifiedAgainstTokensAndParent) {
  BlockPool pool(4, 3, constant_hash);
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.allocate(4, b));
  const auto a = iota_tokens(3, 0), c = iota_tokens(3, 50);
  // Every block hashes to 42: the map holds colliding entries, told apart by content.
  ASSERT_EQ(pool.cache(0, 42, -1, a), 0);
  ASSERT_EQ(pool.cache(1, 42, -1, c), 1);
  ASSERT_EQ(pool.cache(2, 42, 0, c), 2);  // same tokens as block 1, other parent
  EXPECT_EQ(pool.find_cached(42, -1, a), 0);
  EXPECT_EQ(pool.find_cached(42, -1, c), 1);
  EXPECT_EQ(pool.find_cached(42, 0, c), 2);
  EXPECT_EQ(pool.find_cached(42, 1, c), -1);
  EXPECT_EQ(pool.find_cached(42, -1, iota_tokens(3, 1)), -1);
  EXPECT_EQ(pool.find_cached(43, -1, a), -1);  // a different hash is never a hit
  // Caching equal content again returns the first copy and leaves block 3 uncached.
  EXPECT_EQ(pool.cache(3, 42, -1, a), 0);
  EXPECT_FALSE(pool.is_cached(3));
}

TEST(BlockPool, ReusingAParentInvalidatesItsCachedChildren) {
  BlockPool pool(2, 2);
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.allocate(2, b));
  pool.cache(0, 1, -1, iota_tokens(2, 0));
  pool.cache(1, 2, 0, iota_tokens(2, 2));
  EXPECT_EQ(pool.find_cached(2, 0, iota_tokens(2, 2)), 1);
  // The parent is handed out again (child still held) and now caches other tokens: the child's
  // entry names the parent's old generation, so it no longer matches under block 0.
  const uint32_t gen0 = pool.generation(0);
  pool.unref(0);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(1, got));
  ASSERT_EQ(got, std::vector<int32_t>{0});
  EXPECT_EQ(pool.generation(0), gen0 + 1);
  EXPECT_EQ(pool.find_cached(1, -1, iota_tokens(2, 0)), -1);
  pool.cache(0, 9, -1, iota_tokens(2, 90));
  EXPECT_EQ(pool.find_cached(2, 0, iota_tokens(2, 2)), -1);
  pool.reset_cache();
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.find_cached(9, -1, iota_tokens(2, 90)), -1);
  EXPECT_EQ(pool.ref_count(0), 1);
}

}  // namespace
}  // namespace serval::kv
