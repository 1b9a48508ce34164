// CUDA qk_norm_rope_kv against the CPU twin (split, per-head RMSNorm, RoPE, KV append): q_out,
// the cache slots written, and the slots that must stay untouched.
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/qk_norm_rope_kv.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

// bf16 outputs of fp32 math; sincosf (GPU) vs std::sin/cos (CPU) of the same fp32 angle differ
// by a few ulp only. 1e-2 rel L2 is ~5× the bf16 rounding error.
constexpr double kTol = 1e-2;

struct Shape {
  const char* name;
  int hq, hkv, d;
  bool norm;
};

void check(const Shape& s) {
  SCOPED_TRACE(s.name);
  const int T = 37, block_size = 16, num_blocks = 16, D = s.d;
  const int num_slots = num_blocks * block_size;
  const size_t row = size_t(s.hq + 2 * s.hkv) * D, kv_row = size_t(s.hkv) * D;
  auto qkv = random_bf16(size_t(T) * row, uint32_t(D + s.hq), -2.0f, 2.0f);
  auto q_norm = random_bf16(D, 1, 0.5f, 1.5f), k_norm = random_bf16(D, 2, 0.5f, 1.5f);
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = float(1.0 / std::pow(1e6, 2.0 * i / D));
  std::mt19937 rng(9);
  std::vector<int32_t> positions(T), slots(num_slots);
  for (auto& p : positions) p = int32_t(rng() % 40000);
  positions[0] = 0;
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(T);
  slots[3] = slots[20] = -1;  // padding tokens: no cache write

  std::vector<float> qkv_f = to_float(qkv), qn_f = to_float(q_norm), kn_f = to_float(k_norm);
  std::vector<float> want_q(size_t(T) * s.hq * D), want_k(num_slots * kv_row, NAN),
      want_v(num_slots * kv_row, NAN);
  kernels::cpu::qk_norm_rope_kv({qkv_f.data(), s.norm ? qn_f.data() : nullptr,
                                 s.norm ? kn_f.data() : nullptr, positions.data(), inv_freq.data(),
                                 slots.data(), want_q.data(), want_k.data(), want_v.data(), T, s.hq,
                                 s.hkv, D, 1e-6f});

  DeviceBuffer<bf16> d_qkv(qkv), d_qn(q_norm), d_kn(k_norm), d_q(want_q.size()), d_k(want_k.size()),
      d_v(want_v.size());
  DeviceBuffer<float> d_freq(inv_freq);
  DeviceBuffer<int32_t> d_pos(positions), d_slots(slots);
  d_q.poison();
  d_k.poison();
  d_v.poison();
  kernels::cuda::qk_norm_rope_kv(
      {d_qkv.get(), s.norm ? d_qn.get() : nullptr, s.norm ? d_kn.get() : nullptr, d_pos.get(),
       d_freq.get(), d_slots.get(), d_q.get(), d_k.get(), d_v.get(), T, s.hq, s.hkv, D, 1e-6f},
      nullptr);
  EXPECT_LT(rel_l2(d_q.download(), want_q), kTol) << "q_out";

  auto got_k = d_k.download(), got_v = d_v.download();
  std::vector<bool> written(num_slots, false);
  std::vector<float> gk, wk;
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = true;
    for (size_t i = 0; i < kv_row; ++i) {
      const size_t at = size_t(slots[t]) * kv_row + i;
      gk.push_back(bf16_to_float(got_k[at]));
      wk.push_back(want_k[at]);
      // V is a copy of the bf16 input: bit-exact.
      ASSERT_EQ(got_v[at].bits, qkv[t * row + size_t(s.hq + s.hkv) * D + i].bits)
          << "v token " << t << " element " << i;
    }
  }
  EXPECT_LT(rel_l2(gk, wk), kTol) << "k cache rows";
  for (int slot = 0; slot < num_slots; ++slot) {
    if (written[slot]) continue;
    for (size_t i = 0; i < kv_row; ++i) {
      ASSERT_EQ(got_k[slot * kv_row + i].bits, 0xFFFF) << "k slot " << slot << " overwritten";
      ASSERT_EQ(got_v[slot * kv_row + i].bits, 0xFFFF) << "v slot " << slot << " overwritten";
    }
  }
}

TEST(CudaQkNormRopeKv, Qwen3LikeWithNorm) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  check({"qwen3 Hq32 Hkv4 D128 norm", 32, 4, 128, true});
}

TEST(CudaQkNormRopeKv, LlamaLikeWithoutNorm) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  check({"llama Hq32 Hkv8 D128", 32, 8, 128, false});
  check({"llama Hq8 Hkv2 D64", 8, 2, 64, false});
}

TEST(CudaQkNormRopeKv, TinyHeadDim) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  check({"tiny Hq4 Hkv2 D16 norm", 4, 2, 16, true});
  check({"tiny Hq4 Hkv4 D32", 4, 4, 32, false});
}

}  // namespace
}  // namespace serval::testing
