#include "kv/kv_cache_manager.h"

#include <string>

#include "base/error.h"
#include "base/math.h"

namespace serval::kv {

KvCacheManager::KvCacheManager(int num_blocks, int block_size_tokens, bool enable_prefix_caching,
                               BlockHashFn hash_fn)
    : pool_(num_blocks, block_size_tokens, hash_fn),
      enable_prefix_caching_(enable_prefix_caching) {}

int KvCacheManager::match_prefix(uint64_t request_id, std::span<const int32_t> token_ids) {
  RequestBlocks& rb = requests_[request_id];
  if (!rb.blocks.empty()) {
    throw InvalidArgument("match_prefix: request " + std::to_string(request_id) +
                          " already holds " + std::to_string(rb.blocks.size()) + " blocks");
  }
  rb.matched_tokens = rb.queried_tokens = 0;
  if (!enable_prefix_caching_ || token_ids.empty()) return 0;
  const int bs = pool_.block_size();
  const int max_blocks = (static_cast<int>(token_ids.size()) - 1) / bs;
  uint64_t parent_hash = kRootBlockHash;
  int32_t parent_block = -1;
  for (int i = 0; i < max_blocks; ++i) {
    std::span<const int32_t> tokens = token_ids.subspan(static_cast<size_t>(i) * bs, bs);
    uint64_t h = pool_.hash_fn()(parent_hash, tokens);
    int32_t b = pool_.find_cached(h, parent_block, tokens);
    if (b < 0) break;
    pool_.ref(b);
    rb.blocks.push_back(b);
    rb.hashes.push_back(h);
    rb.canonical.push_back({b, pool_.generation(b)});
    parent_hash = h;
    parent_block = b;
  }
  rb.queried_tokens = static_cast<int64_t>(token_ids.size());
  rb.matched_tokens = static_cast<int64_t>(rb.blocks.size()) * bs;
  prefix_queries_ += rb.queried_tokens;
  prefix_hits_ += rb.matched_tokens;
  return static_cast<int>(rb.matched_tokens);
}

void KvCacheManager::undo_match_prefix(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  prefix_queries_ -= it->second.queried_tokens;
  prefix_hits_ -= it->second.matched_tokens;
  free(request_id);
}

int KvCacheManager::num_blocks_needed(uint64_t request_id, int num_tokens) const {
  int want = ceil_div(num_tokens, pool_.block_size());
  auto it = requests_.find(request_id);
  int held = it == requests_.end() ? 0 : static_cast<int>(it->second.blocks.size());
  return want > held ? want - held : 0;
}

bool KvCacheManager::allocate(uint64_t request_id, int num_tokens) {
  int need = num_blocks_needed(request_id, num_tokens);
  if (need == 0) {
    requests_.try_emplace(request_id);
    return true;
  }
  if (need > pool_.num_free()) return false;
  return pool_.allocate(need, requests_[request_id].blocks);
}

void KvCacheManager::cache_computed(uint64_t request_id, std::span<const int32_t> token_ids,
                                    int num_computed_tokens) {
  if (!enable_prefix_caching_) return;
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  RequestBlocks& rb = it->second;
  const int bs = pool_.block_size();
  if (num_computed_tokens > static_cast<int>(token_ids.size()) ||
      ceil_div(num_computed_tokens, bs) > static_cast<int>(rb.blocks.size())) {
    throw InvalidArgument("cache_computed: request " + std::to_string(request_id) + " has " +
                          std::to_string(token_ids.size()) + " tokens and " +
                          std::to_string(rb.blocks.size()) + " blocks, but " +
                          std::to_string(num_computed_tokens) + " computed tokens were claimed");
  }
  const int full = num_computed_tokens / bs;
  for (int i = static_cast<int>(rb.hashes.size()); i < full; ++i) {
    std::span<const int32_t> tokens = token_ids.subspan(static_cast<size_t>(i) * bs, bs);
    uint64_t parent_hash = i == 0 ? kRootBlockHash : rb.hashes[i - 1];
    uint64_t h = pool_.hash_fn()(parent_hash, tokens);
    // When two requests computed the same prefix at once, the second copy stays uncached (and
    // is recycled first when freed); its successors chain onto the cached copy.
    int32_t parent = -1;
    if (i > 0) {
      // The cached copy may have been evicted and reused since; then chain onto our own block
      // (held by us, so its content is current).
      const auto& prev = rb.canonical[i - 1];
      parent = pool_.generation(prev.block) == prev.generation ? prev.block : rb.blocks[i - 1];
    }
    int32_t cached_as = pool_.cache(rb.blocks[i], h, parent, tokens);
    rb.canonical.push_back({cached_as, pool_.generation(cached_as)});
    rb.hashes.push_back(h);
  }
}

void KvCacheManager::free(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool_.unref(*b);
  requests_.erase(it);
}

const std::vector<int32_t>& KvCacheManager::block_table(uint64_t request_id) const {
  static const std::vector<int32_t> kEmpty;
  auto it = requests_.find(request_id);
  return it == requests_.end() ? kEmpty : it->second.blocks;
}

}  // namespace serval::kv
