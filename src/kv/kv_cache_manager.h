// Block tables per request on top of a BlockPool: prefix matching, all-or-nothing allocation,
// registration of computed full blocks in the prefix cache.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace serval::kv {

class KvCacheManager {
 public:
  // `hash_fn` is the block hash (tests inject weak ones to force collisions; nullptr = default).
  KvCacheManager(int num_blocks, int block_size_tokens, bool enable_prefix_caching,
                 BlockHashFn hash_fn = hash_block_tokens);

  // For a request not yet holding blocks: the longest cached prefix of full blocks of
  // token_ids, capped so that at least one token is left to compute (at most len-1 tokens,
  // rounded down to full blocks). Attaches those blocks to the request (ref count +1) and
  // returns the number of cached tokens (a multiple of the block size; 0 when prefix caching
  // is off). Adds len to prefix_queries() and the result to prefix_hits() (caching on only).
  int match_prefix(uint64_t request_id, std::span<const int32_t> token_ids);

  // Undoes a match_prefix whose request was not admitted after all: frees its blocks and takes
  // that match back out of the stats, so that a request retried every step counts once.
  void undo_match_prefix(uint64_t request_id);

  // Ensures the request holds blocks covering its first `num_tokens` tokens. All-or-nothing:
  // returns false and allocates nothing when free blocks do not suffice.
  bool allocate(uint64_t request_id, int num_tokens);

  // Records that the first `num_computed_tokens` of token_ids have their KV written (or being
  // written by the coming step): full blocks among them enter the prefix cache (no-op when
  // prefix caching is off). The request must hold blocks covering them.
  void cache_computed(uint64_t request_id, std::span<const int32_t> token_ids,
                      int num_computed_tokens);

  // Releases all blocks of the request (ref count -1; cached blocks stay revivable). Blocks are
  // released last-first, so a chain's tail is evicted before its head. Unknown ids: no-op.
  void free(uint64_t request_id);

  // Block ids of the request in token order: token t lives in block_table[t / block_size] at
  // slot t % block_size. Empty for unknown ids.
  const std::vector<int32_t>& block_table(uint64_t request_id) const;

  int num_free_blocks() const { return pool_.num_free(); }  // ref count 0 (incl. cached)
  int num_total_blocks() const { return pool_.num_blocks(); }
  int block_size() const { return pool_.block_size(); }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }
  int64_t prefix_queries() const { return prefix_queries_; }  // tokens looked up
  int64_t prefix_hits() const { return prefix_hits_; }        // tokens found
  void reset_prefix_cache() { pool_.reset_cache(); }

  // Blocks needed to cover `num_tokens` tokens for this request beyond those it holds.
  int num_blocks_needed(uint64_t request_id, int num_tokens) const;
  const BlockPool& pool() const { return pool_; }

 private:
  struct RequestBlocks {
    std::vector<int32_t> blocks;   // the block table
    std::vector<uint64_t> hashes;  // chained hashes of blocks[0..hashes.size()), all processed
    // For each processed block, the cached block with its content: itself, or an equal block
    // that was cached first. The parent of the next block's cache entry.
    struct CachedAs {
      int32_t block;
      uint32_t generation;  // of `block` when recorded; a later one means it was reused
    };
    std::vector<CachedAs> canonical;
    int64_t matched_tokens = 0;  // of the last match_prefix, for undo_match_prefix
    int64_t queried_tokens = 0;
  };

  BlockPool pool_;
  bool enable_prefix_caching_;
  std::unordered_map<uint64_t, RequestBlocks> requests_;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
};

}  // namespace serval::kv
