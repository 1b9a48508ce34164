// A fixed pool of KV blocks (ids 0..num_blocks-1) with ref counts, a free list and a prefix cache
// of full blocks keyed by chained hashes.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"

namespace serval::kv {

// Free list order: blocks that hold no cached prefix are handed out first (they sit at the head);
// cached blocks are appended at the tail when their last holder lets go, so they are evicted
// least-recently-freed first. A cached block with ref count 0 can be revived by a prefix hit
// until it is handed out again; then its cache entry is dropped and its generation advances.
//
// A cache entry is exact, not just a hash: it stores the block's token ids and its parent block
// (id and generation at caching time). A lookup verifies both, so a hit means the whole prefix
// up to and including the block has the same token ids as the request's.
class BlockPool {
 public:
  BlockPool(int num_blocks, int block_size_tokens, BlockHashFn hash_fn = hash_block_tokens);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  int num_free() const { return num_free_; }  // ref count 0, cached or not
  BlockHashFn hash_fn() const { return hash_fn_; }

  // Takes `count` blocks from the free list (evicting their cache entries) with ref count 1 and
  // appends their ids to `out`. All-or-nothing: returns false and changes nothing when fewer
  // than `count` blocks are free.
  bool allocate(int count, std::vector<int32_t>& out);

  // Ref count +1; a block at 0 leaves the free list (a prefix-cache revival).
  void ref(int32_t block);
  // Ref count -1; at 0 the block joins the free list (cached: tail; uncached: head).
  void unref(int32_t block);

  // The cached block with this hash whose token ids equal `token_ids` and whose parent is
  // `parent_block` (-1 for a first block) in its current generation; -1 when none.
  int32_t find_cached(uint64_t hash, int32_t parent_block,
                      std::span<const int32_t> token_ids) const;

  // Registers a full, held block in the prefix cache. `token_ids` has block_size entries and
  // `parent_block` is a block holding the previous block's content now (-1 for a first block).
  // Returns the block that now caches this content: `block`, or an equal block cached earlier (then
  // `block` stays uncached; its KV is identical, so either can be a parent).
  int32_t cache(int32_t block, uint64_t hash, int32_t parent_block,
                std::span<const int32_t> token_ids);

  // Drops every cache entry; blocks and ref counts are unchanged.
  void reset_cache();

  int ref_count(int32_t block) const { return blocks_[check_id(block)].ref_count; }
  bool is_cached(int32_t block) const { return blocks_[check_id(block)].cached; }
  uint64_t hash_of(int32_t block) const { return blocks_[check_id(block)].hash; }
  // Advances each time the block is handed out: (id, generation) names one content.
  uint32_t generation(int32_t block) const { return blocks_[check_id(block)].generation; }
  int num_cached() const { return static_cast<int>(cache_.size()); }

  // Free block ids from head (next to be handed out) to tail; for tests and invariant checks.
  std::vector<int32_t> free_list() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    bool cached = false;
    bool in_free_list = false;
    uint64_t hash = 0;
    int32_t parent = -1;             // parent block id when cached (-1: first block)
    uint32_t parent_generation = 0;  // the parent's generation when cached
    uint32_t generation = 0;         // advances each time the block is handed out
    int32_t prev = -1, next = -1;    // free list links
  };

  int32_t check_id(int32_t block) const;
  std::span<const int32_t> tokens_of(int32_t block) const;
  void push_free(int32_t block, bool at_tail);
  void unlink_free(int32_t block);
  void drop_cache_entry(int32_t block);

  int block_size_;
  BlockHashFn hash_fn_;
  std::vector<Block> blocks_;
  std::vector<int32_t> tokens_;  // [num_blocks, block_size]: token ids of cached blocks
  std::unordered_multimap<uint64_t, int32_t> cache_;  // hash -> block id (collisions allowed)
  int32_t free_head_ = -1, free_tail_ = -1;
  int num_free_ = 0;
};

}  // namespace serval::kv
