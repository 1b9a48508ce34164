// The paged-KV layout of the attention GPU tests: query offsets, random non-contiguous block
// tables (one spare, invalid entry per sequence and a few blocks no sequence owns) and which
// cache slots hold a sequence's token (the tests fill the others with NaN: never to be read).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "base/math.h"

namespace serval::testing {

struct PagedLayout {
  std::vector<int32_t> query_start;  // [S + 1]
  std::vector<int32_t> tables;       // [S, max_blocks], −1 where unused
  std::vector<bool> live;            // [num_blocks · block_size]
  int T = 0, max_ctx = 0, max_q = 0, max_blocks = 0, num_blocks = 0;
};

// q_lens / ctx_lens per sequence; the block order comes from std::mt19937(seed).
inline PagedLayout make_paged_layout(const std::vector<int>& q_lens,
                                     const std::vector<int>& ctx_lens, int bs, uint32_t seed) {
  const int S = int(q_lens.size());
  PagedLayout l;
  l.query_start.assign(size_t(S) + 1, 0);
  for (int s = 0; s < S; ++s) l.query_start[s + 1] = l.query_start[s] + q_lens[s];
  l.T = l.query_start[S];
  l.max_ctx = *std::max_element(ctx_lens.begin(), ctx_lens.end());
  l.max_q = *std::max_element(q_lens.begin(), q_lens.end());
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
  l.live.assign(size_t(l.num_blocks) * bs, false);
  for (int s = 0; s < S; ++s)
    for (int j = 0; j < ctx_lens[s]; ++j)
      l.live[size_t(l.tables[size_t(s) * l.max_blocks + j / bs]) * bs + j % bs] = true;
  return l;
}

}  // namespace serval::testing
