#include "kv/block_pool.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace serval::kv {

BlockPool::BlockPool(int num_blocks, int block_size_tokens, BlockHashFn hash_fn)
    : block_size_(block_size_tokens), hash_fn_(hash_fn) {
  if (num_blocks <= 0 || block_size_tokens <= 0) {
    throw InvalidArgument("BlockPool: num_blocks (" + std::to_string(num_blocks) +
                          ") and block_size_tokens (" + std::to_string(block_size_tokens) +
                          ") must be positive");
  }
  if (hash_fn_ == nullptr) hash_fn_ = hash_block_tokens;
  blocks_.resize(num_blocks);
  tokens_.resize(static_cast<size_t>(num_blocks) * block_size_tokens);
  for (int32_t b = 0; b < num_blocks; ++b) push_free(b, /*at_tail=*/true);
}

int32_t BlockPool::check_id(int32_t block) const {
  if (block < 0 || block >= num_blocks()) {
    fail_check("block id in range",
               "block " + std::to_string(block) + " of " + std::to_string(num_blocks()));
  }
  return block;
}

std::span<const int32_t> BlockPool::tokens_of(int32_t block) const {
  return {tokens_.data() + static_cast<size_t>(block) * block_size_,
          static_cast<size_t>(block_size_)};
}

void BlockPool::push_free(int32_t block, bool at_tail) {
  Block& b = blocks_[block];
  b.in_free_list = true;
  if (free_head_ < 0) {
    b.prev = b.next = -1;
    free_head_ = free_tail_ = block;
  } else if (at_tail) {
    b.prev = free_tail_;
    b.next = -1;
    blocks_[free_tail_].next = block;
    free_tail_ = block;
  } else {
    b.prev = -1;
    b.next = free_head_;
    blocks_[free_head_].prev = block;
    free_head_ = block;
  }
  ++num_free_;
}

void BlockPool::unlink_free(int32_t block) {
  Block& b = blocks_[block];
  check(b.in_free_list, "unlink_free: block is in the free list");
  if (b.prev >= 0) {
    blocks_[b.prev].next = b.next;
  } else {
    free_head_ = b.next;
  }
  if (b.next >= 0) {
    blocks_[b.next].prev = b.prev;
  } else {
    free_tail_ = b.prev;
  }
  b.prev = b.next = -1;
  b.in_free_list = false;
  --num_free_;
}

void BlockPool::drop_cache_entry(int32_t block) {
  Block& b = blocks_[block];
  if (!b.cached) return;
  auto [lo, hi] = cache_.equal_range(b.hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == block) {
      cache_.erase(it);
      break;
    }
  }
  b.cached = false;
}

bool BlockPool::allocate(int count, std::vector<int32_t>& out) {
  if (count < 0 || count > num_free_) return false;
  for (int i = 0; i < count; ++i) {
    int32_t id = free_head_;
    unlink_free(id);
    drop_cache_entry(id);
    Block& b = blocks_[id];
    ++b.generation;  // its content is about to change: children cached under it go stale
    b.ref_count = 1;
    out.push_back(id);
  }
  return true;
}

void BlockPool::ref(int32_t block) {
  Block& b = blocks_[check_id(block)];
  if (b.ref_count == 0) unlink_free(block);
  ++b.ref_count;
}

void BlockPool::unref(int32_t block) {
  Block& b = blocks_[check_id(block)];
  check(b.ref_count > 0, "unref: block is held");
  if (--b.ref_count == 0) push_free(block, /*at_tail=*/b.cached);
}

int32_t BlockPool::find_cached(uint64_t hash, int32_t parent_block,
                               std::span<const int32_t> token_ids) const {
  if (static_cast<int>(token_ids.size()) != block_size_) return -1;
  uint32_t parent_generation = parent_block >= 0 ? blocks_[check_id(parent_block)].generation : 0;
  auto [lo, hi] = cache_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    const Block& b = blocks_[it->second];
    if (b.parent != parent_block || b.parent_generation != parent_generation) continue;
    std::span<const int32_t> stored = tokens_of(it->second);
    if (std::equal(stored.begin(), stored.end(), token_ids.begin())) return it->second;
  }
  return -1;
}

int32_t BlockPool::cache(int32_t block, uint64_t hash, int32_t parent_block,
                         std::span<const int32_t> token_ids) {
  Block& b = blocks_[check_id(block)];
  check(b.ref_count > 0 && !b.cached, "cache: block is held and not yet cached");
  check(static_cast<int>(token_ids.size()) == block_size_, "cache: a full block of token ids");
  if (int32_t equal = find_cached(hash, parent_block, token_ids); equal >= 0) return equal;
  std::copy(token_ids.begin(), token_ids.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(block) * block_size_);
  b.cached = true;
  b.hash = hash;
  b.parent = parent_block;
  b.parent_generation = parent_block >= 0 ? blocks_[parent_block].generation : 0;
  cache_.emplace(hash, block);
  return block;
}

void BlockPool::reset_cache() {
  for (Block& b : blocks_) b.cached = false;
  cache_.clear();
}

std::vector<int32_t> BlockPool::free_list() const {
  std::vector<int32_t> ids;
  ids.reserve(num_free_);
  for (int32_t b = free_head_; b >= 0; b = blocks_[b].next) ids.push_back(b);
  return ids;
}

}  // namespace serval::kv
