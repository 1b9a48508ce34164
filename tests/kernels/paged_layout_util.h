// The paged-KV layout of the attention GPU tests: query offsets, block tables and which cache
// slots hold a sequence's token. make_paged_layout gives the checking layout (random
// non-contiguous tables, one spare invalid entry per sequence, a few blocks no sequence owns:
// the tests fill the unowned slots with NaN, never to be read); make_dense_paged_layout the
// benchmark one (equal sequences, every block owned, blocks shuffled).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "base/math.h"

namespace serval::testing {

struct PagedLayout {
  std::vector<int32_t> query_start;  // [S + 1], token offsets of each sequence's query rows
  std::vector<int32_t> ctx_lens;     // [S], keys per sequence (its prefix and its query rows)
  std::vector<int32_t> tables;       // [S, max_blocks], cache block ids, −1 where unused
  std::vector<bool> live;            // [num_blocks · block_size], slot holds a sequence's token
  int block_size = 0;                // tokens per cache block
  int T = 0, max_ctx = 0, max_q = 0, max_blocks = 0, num_blocks = 0;  // T: total query rows
};

// The cache slot of key `key` of sequence `seq` (its block's table entry · block_size + offset).
inline size_t slot_of(const PagedLayout& l, size_t seq, int key) {
  return size_t(l.tables[seq * l.max_blocks + key / l.block_size]) * l.block_size +
         key % l.block_size;
}

namespace detail {

// Fills query_start, ctx_lens, T, max_ctx, max_q and block_size of `l` from the per-sequence
// lengths; the caller then sets max_blocks, num_blocks and tables.
inline void set_paged_lengths(PagedLayout& l, const std::vector<int>& q_lens,
                              const std::vector<int>& ctx_lens, int bs) {
  const int S = int(q_lens.size());
  l.block_size = bs;
  l.query_start.assign(size_t(S) + 1, 0);
  for (int s = 0; s < S; ++s) l.query_start[s + 1] = l.query_start[s] + q_lens[s];
  l.ctx_lens.assign(ctx_lens.begin(), ctx_lens.end());
  l.T = l.query_start[S];
  l.max_ctx = *std::max_element(ctx_lens.begin(), ctx_lens.end());
  l.max_q = *std::max_element(q_lens.begin(), q_lens.end());
}

// Marks the slots of every sequence's first ctx_len tokens live (tables must be set).
inline void mark_live_slots(PagedLayout& l) {
  l.live.assign(size_t(l.num_blocks) * l.block_size, false);
  for (size_t s = 0; s < l.ctx_lens.size(); ++s)
    for (int j = 0; j < l.ctx_lens[s]; ++j) l.live[slot_of(l, s, j)] = true;
}

}  // namespace detail

// q_lens / ctx_lens per sequence; the block order comes from std::mt19937(seed).
inline PagedLayout make_paged_layout(const std::vector<int>& q_lens,
                                     const std::vector<int>& ctx_lens, int bs, uint32_t seed) {
  const int S = int(q_lens.size());
  PagedLayout l;
  detail::set_paged_lengths(l, q_lens, ctx_lens, bs);
  l.max_blocks = ceil_div(l.max_ctx, bs) + 1;  // one spare entry, left invalid (-1)
  int used_blocks = 0;
  for (int ctx : ctx_lens) used_blocks += ceil_div(ctx, bs);
  l.num_blocks = used_blocks + 3;  // a few blocks no sequence owns

  std::mt19937 rng(seed);
  std::vector<int32_t> perm(l.num_blocks);
  l.tables.assign(size_t(S) * l.max_blocks, -1);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (int s = 0; s < S; ++s)
    for (int b = 0; b < ceil_div(ctx_lens[s], bs); ++b)
      l.tables[size_t(s) * l.max_blocks + b] = perm[next++];
  detail::mark_live_slots(l);
  return l;
}

// num_seqs sequences of q_len query rows at context ctx_len each (prefix ctx_len − q_len): every
// table entry valid, no spare blocks, the blocks in the order of std::shuffle with
// std::mt19937(1).
inline PagedLayout make_dense_paged_layout(int num_seqs, int q_len, int ctx_len, int bs) {
  PagedLayout l;
  detail::set_paged_lengths(l, std::vector<int>(num_seqs, q_len),
                            std::vector<int>(num_seqs, ctx_len), bs);
  l.max_blocks = ceil_div(ctx_len, bs);
  l.num_blocks = num_seqs * l.max_blocks;
  l.tables.resize(l.num_blocks);
  std::iota(l.tables.begin(), l.tables.end(), 0);
  std::mt19937 rng(1);
  std::shuffle(l.tables.begin(), l.tables.end(), rng);
  detail::mark_live_slots(l);
  return l;
}

}  // namespace serval::testing
