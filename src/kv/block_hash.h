// Chained hashes of full KV blocks: hash(block i) = H(hash(block i-1), token ids of block i).
#pragma once
#include <cstdint>
#include <span>

namespace serval::kv {

// The parent hash of a request's first block.
inline constexpr uint64_t kRootBlockHash = 0x5e7a1c0ffee0d15eULL;

// A block hash function. Only a lookup key: a hit is always verified against the stored token
// ids and the parent block, so a weak function (tests inject one) costs speed, never correctness.
using BlockHashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> token_ids);

// The default: a 64-bit multiply-xorshift mix over the parent hash and every token id.
uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> token_ids);

}  // namespace serval::kv
