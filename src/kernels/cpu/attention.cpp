// Paged KV append and causal paged attention on the CPU (fp32, exact softmax), also in MLA's
// latent form.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace serval::kernels::cpu {

namespace {

// Element i of a KV cache row of `t` as float.
float load_kv(const void* base, DType t, size_t i) {
  return load_as_float(base, t, i);
}

void store_kv(void* base, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::kBF16:
      static_cast<bf16*>(base)[i] = float_to_bf16(v);
      return;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(base)[i] = float_to_e4m3(v);
      return;
    case DType::kF8E5M2:
      static_cast<uint8_t*>(base)[i] = float_to_e5m2(v);
      return;
    default:
      throw std::invalid_argument("KV cache dtype must be f32, bf16 or fp8");
  }
}

// The token's position in its sequence (the query rows of sequence s end at context_lens[s]).
struct QueryPlace {
  int seq, pos;
};
QueryPlace place_of(const int32_t* query_start, const int32_t* context_lens, int num_seqs, int t) {
  const int s = int(std::upper_bound(query_start, query_start + num_seqs + 1, t) - query_start) - 1;
  const int query_len = query_start[s + 1] - query_start[s];
  return {s, context_lens[s] - query_len + (t - query_start[s])};
}

}  // namespace

void kv_append(const KvAppendParams& p) {
  const size_t row = size_t(p.num_kv_heads) * p.head_dim;
  const float inv_k = 1.0f / p.k_scale, inv_v = 1.0f / p.v_scale;
  for (int t = 0; t < p.num_tokens; ++t) {
    int32_t slot = p.slot_mapping[t];
    if (slot < 0) continue;  // padding token
    for (size_t i = 0; i < row; ++i) {
      store_kv(p.k_cache, p.cache_dtype, size_t(slot) * row + i, p.k[t * row + i] * inv_k);
      store_kv(p.v_cache, p.cache_dtype, size_t(slot) * row + i, p.v[t * row + i] * inv_v);
    }
  }
}

void paged_attention(const PagedAttentionParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const size_t kv_row = size_t(p.num_kv_heads) * p.head_dim;
  const int num_tokens = p.query_start[p.num_seqs];
  // Work items: (token, q head); each finds its sequence by binary search.
  ThreadPool::global().parallel_for(
      int64_t(num_tokens) * p.num_q_heads, 4, [&](int64_t begin, int64_t end) {
        std::vector<float> scores, kv(p.head_dim), row(p.head_dim);
        for (int64_t item = begin; item < end; ++item) {
          int t = int(item / p.num_q_heads), h = int(item % p.num_q_heads);
          const QueryPlace at = place_of(p.query_start, p.context_lens, p.num_seqs, t);
          int num_keys = at.pos + 1;  // causal
          const int32_t* table = p.block_tables + size_t(at.seq) * p.max_blocks_per_seq;
          const float* q = p.q + (size_t(t) * p.num_q_heads + h) * p.head_dim;
          const int kv_head = h / group;
          // Element offset of key j's row for this kv head.
          auto row_of = [&](int j) {
            size_t slot = size_t(table[j / p.block_size]) * p.block_size + j % p.block_size;
            return slot * kv_row + size_t(kv_head) * p.head_dim;
          };
          scores.resize(num_keys);
          float max_score = -INFINITY;
          for (int j = 0; j < num_keys; ++j) {
            const size_t at = row_of(j);
            float dot = 0;
            for (int d = 0; d < p.head_dim; ++d)
              dot += q[d] * load_kv(p.k_cache, p.cache_dtype, at + d);
            scores[j] = dot * p.scale;
            max_score = std::max(max_score, scores[j]);
          }
          float denom = 0;
          for (int j = 0; j < num_keys; ++j) {
            scores[j] = std::exp(scores[j] - max_score);
            denom += scores[j];
          }
          std::fill(kv.begin(), kv.end(), 0.0f);
          for (int j = 0; j < num_keys; ++j) {
            const size_t at = row_of(j);
            float w = scores[j] / denom;
            for (int d = 0; d < p.head_dim; ++d)
              kv[d] += w * load_kv(p.v_cache, p.cache_dtype, at + d);
          }
          float* out = p.out + (size_t(t) * p.num_q_heads + h) * p.head_dim;
          for (int d = 0; d < p.head_dim; ++d) out[d] = kv[d] * p.v_scale;
        }
      });
}

namespace {

// Rotates x [rope_dim] (pairs per MlaPrepareParams) into out in neox order, times scale.
void mla_rotate(const float* x, const float* cos, const float* sin, int rope_dim, bool interleaved,
                float scale, float* out) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float a = interleaved ? x[2 * i] : x[i];
    const float b = interleaved ? x[2 * i + 1] : x[i + half];
    out[i] = (a * cos[i] - b * sin[i]) * scale;
    out[i + half] = (b * cos[i] + a * sin[i]) * scale;
  }
}

}  // namespace

void mla_prepare(const MlaPrepareParams& p) {
  const int L = p.latent_dim, R = p.rope_dim, half = R / 2, row = L + R;
  std::vector<float> cos(half), sin(half), c(L), pe(R);
  const float inv_k = 1.0f / p.k_scale;
  for (int t = 0; t < p.num_tokens; ++t) {
    for (int i = 0; i < half; ++i) {
      const float angle = float(p.positions[t]) * p.inv_freq[i];
      cos[i] = std::cos(angle);
      sin[i] = std::sin(angle);
    }
    for (int h = 0; h < p.num_heads; ++h) {
      const float* q = p.q + (size_t(t) * p.num_heads + h) * p.q_stride + p.q_rope_offset;
      mla_rotate(q, cos.data(), sin.data(), R, p.rope_interleaved, p.rope_scale,
                 p.q_pe + (size_t(t) * p.num_heads + h) * R);
    }
    const int32_t slot = p.slot_mapping[t];
    if (slot < 0) continue;  // padding token
    const float* kv = p.kv + size_t(t) * row;
    rms_norm({kv, nullptr, p.kv_norm, p.kv_norm_dtype, c.data(), 1, L, p.eps});
    mla_rotate(kv + L, cos.data(), sin.data(), R, p.rope_interleaved, p.rope_scale, pe.data());
    const size_t at = size_t(slot) * row;
    for (int i = 0; i < L; ++i) store_kv(p.cache, p.cache_dtype, at + i, c[i] * inv_k);
    for (int i = 0; i < R; ++i) store_kv(p.cache, p.cache_dtype, at + L + i, pe[i] * inv_k);
  }
}

void mla_attention(const MlaAttentionParams& p) {
  const int L = p.latent_dim, R = p.rope_dim;
  const size_t row = size_t(L) + R;
  const int num_tokens = p.query_start[p.num_seqs];
  ThreadPool::global().parallel_for(
      int64_t(num_tokens) * p.num_heads, 4, [&](int64_t begin, int64_t end) {
        std::vector<float> scores, acc(L);
        for (int64_t item = begin; item < end; ++item) {
          const int t = int(item / p.num_heads), h = int(item % p.num_heads);
          const QueryPlace at = place_of(p.query_start, p.context_lens, p.num_seqs, t);
          const int num_keys = at.pos + 1;  // causal
          const int32_t* table = p.block_tables + size_t(at.seq) * p.max_blocks_per_seq;
          auto row_of = [&](int j) {
            return (size_t(table[j / p.block_size]) * p.block_size + j % p.block_size) * row;
          };
          const float* q_lat = p.q_lat + (size_t(t) * p.num_heads + h) * L;
          const float* q_pe = p.q_pe + (size_t(t) * p.num_heads + h) * R;
          scores.resize(num_keys);
          float max_score = -INFINITY;
          for (int j = 0; j < num_keys; ++j) {
            const size_t base = row_of(j);
            float dot = 0;
            for (int d = 0; d < L; ++d) dot += q_lat[d] * load_kv(p.cache, p.cache_dtype, base + d);
            for (int d = 0; d < R; ++d)
              dot += q_pe[d] * load_kv(p.cache, p.cache_dtype, base + L + d);
            scores[j] = dot * p.scale;
            max_score = std::max(max_score, scores[j]);
          }
          float denom = 0;
          for (int j = 0; j < num_keys; ++j) denom += (scores[j] = std::exp(scores[j] - max_score));
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int j = 0; j < num_keys; ++j) {
            const size_t base = row_of(j);
            const float w = scores[j] / denom;
            for (int d = 0; d < L; ++d) acc[d] += w * load_kv(p.cache, p.cache_dtype, base + d);
          }
          float* out = p.out + (size_t(t) * p.num_heads + h) * L;
          for (int d = 0; d < L; ++d) out[d] = acc[d] * p.v_scale;
        }
      });
}

}  // namespace serval::kernels::cpu
