#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "base/error.h"

namespace serval::kv {
namespace {

constexpr int kBs = 16;

std::vector<int32_t> tokens(int n, int32_t first = 1000) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

uint64_t constant_hash(uint64_t, std::span<const int32_t>) {
  return 7;
}

// Allocates and computes a whole prompt for `id`, as a finished prefill would.
void compute(KvCacheManager& kv, uint64_t id, const std::vector<int32_t>& t) {
  int n = static_cast<int>(t.size());
  ASSERT_TRUE(kv.allocate(id, n));
  kv.cache_computed(id, t, n);
}

TEST(KvCacheManager, AllocateCoversTokensAllOrNothing) {
  KvCacheManager kv(5, kBs, true);
  EXPECT_EQ(kv.num_total_blocks(), 5);
  EXPECT_EQ(kv.block_size(), kBs);
  ASSERT_TRUE(kv.allocate(1, 17));  // 2 blocks
  EXPECT_EQ(kv.block_table(1), (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(kv.allocate(1, 32));  // still 2
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  EXPECT_EQ(kv.num_blocks_needed(1, 49), 2);
  EXPECT_FALSE(kv.allocate(2, 4 * kBs));  // 4 > 3 free: nothing taken
  EXPECT_EQ(kv.num_free_blocks(), 3);
  EXPECT_TRUE(kv.block_table(2).empty());
  ASSERT_TRUE(kv.allocate(2, 3 * kBs));
  EXPECT_EQ(kv.block_table(2), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  kv.free(1);
  kv.free(2);
  kv.free(99);  // unknown: no-op
  EXPECT_EQ(kv.num_free_blocks(), 5);
  EXPECT_TRUE(kv.block_table(1).empty());
}

TEST(KvCacheManager, PrefixHitLeavesOneTokenToCompute) {
  KvCacheManager kv(16, kBs, true);
  const auto prompt = tokens(3 * kBs);
  EXPECT_EQ(kv.match_prefix(1, prompt), 0);
  compute(kv, 1, prompt);
  const std::vector<int32_t> table1 = kv.block_table(1);

  // Same 48 tokens: at most 47 may come from the cache, so 2 blocks.
  EXPECT_EQ(kv.match_prefix(2, prompt), 2 * kBs);
  EXPECT_EQ(kv.block_table(2), (std::vector<int32_t>{table1[0], table1[1]}));
  EXPECT_EQ(kv.pool().ref_count(table1[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(table1[2]), 1);
  ASSERT_TRUE(kv.allocate(2, 3 * kBs));
  EXPECT_NE(kv.block_table(2)[2], table1[2]);

  // 49 tokens with the same first 48: all 3 blocks.
  auto longer = prompt;
  longer.push_back(5);
  EXPECT_EQ(kv.match_prefix(3, longer), 3 * kBs);
  EXPECT_EQ(kv.block_table(3), table1);

  // Same first block, different second: 1 block (the hit is checked token by token).
  auto diverging = longer;
  diverging[kBs + 3] = -1;
  EXPECT_EQ(kv.match_prefix(4, diverging), kBs);

  EXPECT_EQ(kv.prefix_queries(), 48 + 48 + 49 + 49);
  EXPECT_EQ(kv.prefix_hits(), 0 + 32 + 48 + 16);
  EXPECT_THROW(kv.match_prefix(4, diverging), InvalidArgument);  // already holds blocks
  kv.undo_match_prefix(4);
  EXPECT_EQ(kv.prefix_queries(), 48 + 48 + 49);
  EXPECT_EQ(kv.prefix_hits(), 0 + 32 + 48);
  EXPECT_EQ(kv.pool().ref_count(table1[0]), 3);
}

TEST(KvCacheManager, FreedPrefixIsRevivedUntilReallocated) {
  KvCacheManager kv(4, kBs, true);
  const auto prompt = tokens(2 * kBs + 1);
  compute(kv, 1, prompt);
  kv.free(1);
  EXPECT_EQ(kv.num_free_blocks(), 4);
  EXPECT_EQ(kv.match_prefix(2, prompt), 2 * kBs);
  EXPECT_EQ(kv.num_free_blocks(), 2);
  kv.free(2);
  // Fill the pool with other content: the uncached block goes first, then the cached ones.
  ASSERT_TRUE(kv.allocate(3, 4 * kBs));
  kv.cache_computed(3, tokens(4 * kBs, 0), 4 * kBs);
  kv.free(3);
  EXPECT_EQ(kv.match_prefix(4, prompt), 0);
  EXPECT_EQ(kv.match_prefix(5, tokens(4 * kBs, 0)), 3 * kBs);
}

TEST(KvCacheManager, PartialBlocksAndDisabledCachingAreNotCached) {
  KvCacheManager kv(8, kBs, true);
  const auto prompt = tokens(kBs + 5);
  ASSERT_TRUE(kv.allocate(1, kBs + 5));
  kv.cache_computed(1, prompt, 10);  // a chunk that ends inside block 0
  EXPECT_EQ(kv.pool().num_cached(), 0);
  kv.cache_computed(1, prompt, kBs + 5);
  EXPECT_EQ(kv.pool().num_cached(), 1);
  EXPECT_THROW(kv.cache_computed(1, prompt, 3 * kBs), InvalidArgument);

  KvCacheManager off(8, kBs, false);
  compute(off, 1, prompt);
  EXPECT_EQ(off.pool().num_cached(), 0);
  EXPECT_EQ(off.match_prefix(2, prompt), 0);
  EXPECT_EQ(off.prefix_queries(), 0);
  off.reset_prefix_cache();
}

TEST(KvCacheManager, HashCollisionsNeverGiveWrongBlocks) {
  KvCacheManager kv(16, kBs, true, constant_hash);  // every block hashes to 7
  const auto a = tokens(2 * kBs + 1, 0), b = tokens(2 * kBs + 1, 500);
  compute(kv, 1, a);
  EXPECT_EQ(kv.match_prefix(2, b), 0);
  compute(kv, 2, b);
  EXPECT_EQ(kv.match_prefix(3, a), 2 * kBs);
  EXPECT_EQ(kv.block_table(3), (std::vector<int32_t>{kv.block_table(1)[0], kv.block_table(1)[1]}));
  EXPECT_EQ(kv.match_prefix(4, b), 2 * kBs);
  EXPECT_EQ(kv.block_table(4), (std::vector<int32_t>{kv.block_table(2)[0], kv.block_table(2)[1]}));
  // a's first block followed by b's second block: only the first matches (the cached second
  // block with b's tokens hangs under b's first block).
  auto mixed = a;
  std::copy(b.begin() + kBs, b.end(), mixed.begin() + kBs);
  EXPECT_EQ(kv.match_prefix(5, mixed), kBs);
}

TEST(KvCacheManager, ConcurrentDuplicatesChainOntoTheFirstCachedCopy) {
  KvCacheManager kv(16, kBs, true);
  const auto prompt = tokens(2 * kBs + 1);
  // Both requests miss, then compute the same first block in separate blocks.
  ASSERT_EQ(kv.match_prefix(1, prompt), 0);
  ASSERT_EQ(kv.match_prefix(2, prompt), 0);
  ASSERT_TRUE(kv.allocate(1, kBs));
  ASSERT_TRUE(kv.allocate(2, 2 * kBs + 1));
  kv.cache_computed(1, prompt, kBs);
  kv.cache_computed(2, prompt, 2 * kBs);
  const int32_t a0 = kv.block_table(1)[0], b0 = kv.block_table(2)[0], b1 = kv.block_table(2)[1];
  EXPECT_FALSE(kv.pool().is_cached(b0));
  EXPECT_TRUE(kv.pool().is_cached(b1));
  EXPECT_EQ(kv.match_prefix(3, prompt), 2 * kBs);
  EXPECT_EQ(kv.block_table(3), (std::vector<int32_t>{a0, b1}));
}

TEST(KvCacheManager, StaleCachedCopyIsNotUsedAsParent) {
  // Colliding hashes, so that only the parent check can tell the chains apart.
  KvCacheManager kv(3, kBs, true, constant_hash);
  const auto prompt = tokens(2 * kBs + 1);
  ASSERT_EQ(kv.match_prefix(1, prompt), 0);
  ASSERT_EQ(kv.match_prefix(2, prompt), 0);
  ASSERT_TRUE(kv.allocate(1, kBs));
  ASSERT_TRUE(kv.allocate(2, 2 * kBs));
  kv.cache_computed(1, prompt, kBs);  // block a0 caches the first block
  kv.cache_computed(2, prompt, kBs);  // b0 is a duplicate, stays uncached
  const int32_t a0 = kv.block_table(1)[0];
  kv.free(1);
  // Request 3 gets a0 back and caches other tokens X in it.
  std::vector<int32_t> x = tokens(kBs, 9000);
  ASSERT_TRUE(kv.allocate(3, kBs));
  ASSERT_EQ(kv.block_table(3)[0], a0);
  kv.cache_computed(3, x, kBs);
  // Request 2 now finishes its second block: its parent must be its own b0, not a0 (which now
  // holds X), or X followed by the prompt's second block would hit KV computed after the prompt.
  kv.cache_computed(2, prompt, 2 * kBs);
  EXPECT_TRUE(kv.pool().is_cached(kv.block_table(2)[1]));
  auto x_then_second = x;
  x_then_second.insert(x_then_second.end(), prompt.begin() + kBs, prompt.end());
  EXPECT_EQ(kv.match_prefix(4, x_then_second), kBs);
  EXPECT_EQ(kv.match_prefix(5, prompt), 0);  // b0 uncached, a0 reused: nothing to hit
}

}  // namespace
}  // namespace serval::kv
