// MLA's absorbed form on the CPU backend (head_linear, mla_attention, head_linear: what
// MlaAttention runs) against the expanded multi-head form it stands for, written out here: per
// head a key [W_UK·c, k_pe] and a value W_UV·c from the normalized latent c, the query's rope part
// rotated as complex pairs (interleaved) or halves (neox), causal softmax per sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "support/compare.h"

namespace serval::backend {
namespace {

constexpr int kHeads = 3, kNope = 4, kRope = 4, kValue = 5, kLatent = 6, kBlockSize = 4;
constexpr float kEps = 1e-6f;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

Tensor host(const std::vector<float>& v, Shape shape) {
  Tensor t = host_empty(DType::kF32, std::move(shape));
  std::copy(v.begin(), v.end(), t.as<float>());
  return t;
}

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = host_empty(DType::kI32, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.as<int32_t>());
  return t;
}

// x rotated by `angle`·inv_freq[i] per pair; interleaved pairs (2i, 2i+1) keep their places,
// neox pairs (i, i + half) theirs.
std::vector<float> rotate(const float* x, int pos, const std::vector<float>& inv_freq,
                          bool interleaved, float scale) {
  const int half = kRope / 2;
  std::vector<float> out(kRope);
  for (int i = 0; i < half; ++i) {
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float c = std::cos(pos * inv_freq[i]), s = std::sin(pos * inv_freq[i]);
    out[a] = (x[a] * c - x[b] * s) * scale;
    out[b] = (x[b] * c + x[a] * s) * scale;
  }
  return out;
}

struct Case {
  bool interleaved;
  float rope_scale;
};

class MlaAbsorbed : public ::testing::TestWithParam<Case> {};

TEST_P(MlaAbsorbed, EqualsExpandedHeads) {
  const Case cs = GetParam();
  // Two sequences from position 0: 5 and 3 tokens, in blocks {2, 0} and {1}.
  const std::vector<int32_t> query_start{0, 5, 8}, lens{5, 3}, positions{0, 1, 2, 3, 4, 0, 1, 2};
  const std::vector<int32_t> tables{2, 0, 1, 0};  // [2 seqs, 2 blocks]
  const int T = 8, qk = kNope + kRope;
  std::vector<int32_t> slots(T);
  for (int t = 0; t < T; ++t) {
    const int s = t < 5 ? 0 : 1, p = positions[t];
    slots[t] = tables[s * 2 + p / kBlockSize] * kBlockSize + p % kBlockSize;
  }
  const std::vector<float> q = random_values(size_t(T) * kHeads * qk, 1);
  const std::vector<float> kv = random_values(size_t(T) * (kLatent + kRope), 2);
  std::vector<float> norm_w = random_values(kLatent, 3);
  for (float& w : norm_w) w += 1.5f;
  const std::vector<float> kv_b = random_values(size_t(kHeads) * (kNope + kValue) * kLatent, 4);
  const std::vector<float> inv_freq{1.0f, 0.1f};
  const float scale = 0.37f;

  // The expanded form.
  std::vector<std::vector<float>> c(T), k_pe(T);
  for (int t = 0; t < T; ++t) {
    const float* row = kv.data() + size_t(t) * (kLatent + kRope);
    double ss = 0;
    for (int i = 0; i < kLatent; ++i) ss += double(row[i]) * row[i];
    const float inv = float(1.0 / std::sqrt(ss / kLatent + kEps));
    for (int i = 0; i < kLatent; ++i) c[t].push_back(row[i] * inv * norm_w[i]);
    k_pe[t] = rotate(row + kLatent, positions[t], inv_freq, cs.interleaved, cs.rope_scale);
  }
  auto kv_b_row = [&](int h, int r) {
    return kv_b.data() + (size_t(h) * (kNope + kValue) + r) * kLatent;
  };
  auto project = [&](int h, int first_row, int rows, const std::vector<float>& x) {
    std::vector<float> y(rows, 0.0f);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < kLatent; ++j) y[r] += kv_b_row(h, first_row + r)[j] * x[j];
    return y;
  };
  std::vector<float> want(size_t(T) * kHeads * kValue);
  for (int t = 0; t < T; ++t) {
    const int s = t < 5 ? 0 : 1;
    for (int h = 0; h < kHeads; ++h) {
      const float* qh = q.data() + (size_t(t) * kHeads + h) * qk;
      const std::vector<float> q_pe =
          rotate(qh + kNope, positions[t], inv_freq, cs.interleaved, cs.rope_scale);
      std::vector<float> scores;
      for (int j = query_start[s]; j <= t; ++j) {
        const std::vector<float> k_nope = project(h, 0, kNope, c[j]);
        float dot = 0;
        for (int i = 0; i < kNope; ++i) dot += qh[i] * k_nope[i];
        for (int i = 0; i < kRope; ++i) dot += q_pe[i] * k_pe[j][i];
        scores.push_back(dot * scale);
      }
      float m = -INFINITY, sum = 0;
      for (float x : scores) m = std::max(m, x);
      for (float& x : scores) sum += (x = std::exp(x - m));
      float* out = want.data() + (size_t(t) * kHeads + h) * kValue;
      for (int j = query_start[s]; j <= t; ++j) {
        const std::vector<float> v = project(h, kNope, kValue, c[j]);
        for (int i = 0; i < kValue; ++i) out[i] += scores[j - query_start[s]] / sum * v[i];
      }
    }
  }

  // The absorbed form, as MlaAttention runs it.
  std::unique_ptr<Backend> b = make_cpu_backend();
  std::vector<float> key_t(size_t(kHeads) * kLatent * kNope),
      value(size_t(kHeads) * kValue * kLatent);
  for (int h = 0; h < kHeads; ++h)
    for (int j = 0; j < kLatent; ++j) {
      for (int i = 0; i < kNope; ++i)
        key_t[(size_t(h) * kLatent + j) * kNope + i] = kv_b_row(h, i)[j];
      for (int i = 0; i < kValue; ++i)
        value[(size_t(h) * kValue + i) * kLatent + j] = kv_b_row(h, kNope + i)[j];
    }
  const Tensor q_t = host(q, {T, kHeads * qk}), kv_t = host(kv, {T, kLatent + kRope});
  const Tensor key_t_t = host(key_t, {kHeads, kLatent, kNope});
  const Tensor value_t = host(value, {kHeads, kValue, kLatent});
  const Tensor norm_t = host(norm_w, {kLatent}), inv_freq_t = host(inv_freq, {kRope / 2});
  StepMetadata meta;
  meta.positions = host_i32(positions);
  meta.slot_mapping = host_i32(slots);
  meta.query_start = host_i32(query_start);
  meta.context_lens = host_i32(lens);
  meta.block_tables = host_i32(tables);
  meta.num_tokens = T;
  meta.num_seqs = 2;
  meta.max_blocks_per_seq = 2;
  KvCacheLayer cache;
  cache.k = host_empty(DType::kF32, {3, kBlockSize, 1, kLatent + kRope});
  cache.block_size = kBlockSize;
  MlaParams p;
  p.num_heads = kHeads;
  p.latent_dim = kLatent;
  p.rope_dim = kRope;
  p.q_stride = qk;
  p.q_rope_offset = kNope;
  p.scale = scale;
  p.rms_norm_eps = kEps;
  p.rope_scale = cs.rope_scale;
  p.rope_interleaved = cs.interleaved;
  p.kv_norm = &norm_t;
  p.inv_freq = &inv_freq_t;
  Tensor q_lat = b->empty(DType::kF32, {T, kHeads * kLatent});
  b->head_linear(q_t, qk, key_t_t, q_lat);
  Tensor latent_out = b->empty(DType::kF32, {T, kHeads * kLatent});
  b->mla_attention(q_t, q_lat, kv_t, p, cache, meta, latent_out);
  Tensor got = b->empty(DType::kF32, {T, kHeads * kValue});
  b->head_linear(latent_out, kLatent, value_t, got);
  EXPECT_LT(testing::rel_l2({got.as<float>(), want.size()}, want), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Rope, MlaAbsorbed,
                         ::testing::Values(Case{true, 1.0f}, Case{false, 1.0f}, Case{true, 1.3f}));

}  // namespace
}  // namespace serval::backend
