// Paged KV append and causal paged attention on the CPU (fp32, exact softmax).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace serval::kernels::cpu {

void kv_append(const KvAppendParams& p) {
  const size_t row = size_t(p.num_kv_heads) * p.head_dim;
  for (int t = 0; t < p.num_tokens; ++t) {
    int32_t slot = p.slot_mapping[t];
    if (slot < 0) continue;  // padding token
    std::memcpy(p.k_cache + size_t(slot) * row, p.k + t * row, row * 4);
    std::memcpy(p.v_cache + size_t(slot) * row, p.v + t * row, row * 4);
  }
}

void paged_attention(const PagedAttentionParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const size_t kv_row = size_t(p.num_kv_heads) * p.head_dim;
  const int num_tokens = p.query_start[p.num_seqs];
  // Work items: (token, q head); each finds its sequence by binary search.
  ThreadPool::global().parallel_for(
      int64_t(num_tokens) * p.num_q_heads, 4, [&](int64_t begin, int64_t end) {
        std::vector<float> scores;
        for (int64_t item = begin; item < end; ++item) {
          int t = int(item / p.num_q_heads), h = int(item % p.num_q_heads);
          int s = int(std::upper_bound(p.query_start, p.query_start + p.num_seqs + 1, t) -
                      p.query_start) -
                  1;
          int query_len = p.query_start[s + 1] - p.query_start[s];
          int pos = p.context_lens[s] - query_len + (t - p.query_start[s]);
          int num_keys = pos + 1;  // causal
          const int32_t* table = p.block_tables + size_t(s) * p.max_blocks_per_seq;
          const float* q = p.q + (size_t(t) * p.num_q_heads + h) * p.head_dim;
          const int kv_head = h / group;
          scores.resize(num_keys);
          float max_score = -INFINITY;
          for (int j = 0; j < num_keys; ++j) {
            size_t slot = size_t(table[j / p.block_size]) * p.block_size + j % p.block_size;
            const float* k = p.k_cache + slot * kv_row + kv_head * p.head_dim;
            float dot = 0;
            for (int d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
            scores[j] = dot * p.scale;
            max_score = std::max(max_score, scores[j]);
          }
          float denom = 0;
          for (int j = 0; j < num_keys; ++j) {
            scores[j] = std::exp(scores[j] - max_score);
            denom += scores[j];
          }
          float* out = p.out + (size_t(t) * p.num_q_heads + h) * p.head_dim;
          std::fill(out, out + p.head_dim, 0.0f);
          for (int j = 0; j < num_keys; ++j) {
            size_t slot = size_t(table[j / p.block_size]) * p.block_size + j % p.block_size;
            const float* v = p.v_cache + slot * kv_row + kv_head * p.head_dim;
            float w = scores[j] / denom;
            for (int d = 0; d < p.head_dim; ++d) out[d] += w * v[d];
          }
        }
      });
}

}  // namespace serval::kernels::cpu
