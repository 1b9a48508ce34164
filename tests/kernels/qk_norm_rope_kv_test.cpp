// CUDA qk_norm_rope_kv against the CPU twin (split, per-head RMSNorm, RoPE, KV append): q_out,
// the cache slots written, and the slots that must stay untouched.
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "kernels/bench_timing.h"
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

// T tokens: 37 (a prefill-sized grid of 4-warp CTAs for the Qwen3 shape) or a decode-sized 1..3
// (one warp per CTA).
void check(const Shape& s, int T = 37) {
  SCOPED_TRACE(std::string(s.name) + " T=" + std::to_string(T));
  const int block_size = 16, num_blocks = 16, D = s.d;
  const int num_slots = num_blocks * block_size;
  const size_t row = size_t(s.hq + 2 * s.hkv) * D, kv_row = size_t(s.hkv) * D;
  auto qkv = random_bf16(size_t(T) * row, uint32_t(D + s.hq), -2.0f, 2.0f);
  auto q_norm = random_bf16(D, 1, 0.5f, 1.5f), k_norm = random_bf16(D, 2, 0.5f, 1.5f);
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = float(1.0 / std::pow(1e6, 2.0 * i / D));
  std::mt19937 rng(9);
  std::vector<int32_t> positions(T), slots(num_slots);
  for (auto& p : positions) p = int32_t(rng() % 40000);
  if (T > 1) positions[0] = 0;
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(T);
  // Padding tokens: no cache write.
  for (int t : {1, 20})
    if (t < T - 1) slots[t] = -1;

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

// Decode-sized grids (a warp per CTA): one token at a random position, and three with one
// padding token.
TEST(CudaQkNormRopeKv, DecodeTokens) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (int T : {1, 3}) {
    check({"qwen3 Hq32 Hkv4 D128 norm", 32, 4, 128, true}, T);
    check({"llama Hq32 Hkv8 D128", 32, 8, 128, false}, T);
    check({"tiny Hq4 Hkv2 D16 norm", 4, 2, 16, true}, T);
  }
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

// DISABLED_ benchmark at the Qwen3-30B-A3B shape (Hq 32, Hkv 4, D 128, q/k norm, bf16 cache): µs
// per launch of 200 launches captured in one CUDA graph (launch overhead hidden), the median of
// 20 replays. Before the load-chain rework (ncu): 4.0 us for one token. Run with
// kernels_gpu --gtest_also_run_disabled_tests --gtest_filter='*QkNormRopeKvBench*'
TEST(CudaQkNormRopeKvBench, DISABLED_Qwen3Shape) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  constexpr int kHq = 32, kHkv = 4, kD = 128, kReps = 200;
  for (int T : {1, 8, 64, 8192}) {
    const size_t row = size_t(kHq + 2 * kHkv) * kD;
    std::vector<int32_t> positions(T), slots(T);
    for (int t = 0; t < T; ++t) positions[t] = slots[t] = 1000 + t;
    std::vector<float> inv_freq(kD / 2);
    for (int i = 0; i < kD / 2; ++i) inv_freq[i] = float(1.0 / std::pow(1e6, 2.0 * i / kD));
    DeviceBuffer<bf16> qkv(random_bf16(size_t(T) * row, 5)), qn(random_bf16(kD, 6, 0.5f, 1.5f)),
        kn(random_bf16(kD, 7, 0.5f, 1.5f)), q_out(size_t(T) * kHq * kD),
        k_cache(size_t(T + 1000) * kHkv * kD), v_cache(size_t(T + 1000) * kHkv * kD);
    DeviceBuffer<float> freq(inv_freq);
    DeviceBuffer<int32_t> pos(positions), slot(slots);
    const kernels::cuda::QkNormRopeKvParams p{
        qkv.get(),     qn.get(),      kn.get(), pos.get(), freq.get(), slot.get(), q_out.get(),
        k_cache.get(), v_cache.get(), T,        kHq,       kHkv,       kD,         1e-6f};
    const double us = graph_us(
        [&](cudaStream_t s) {
          for (int i = 0; i < kReps; ++i) kernels::cuda::qk_norm_rope_kv(p, s);
        },
        kReps);
    // Bytes: qkv read, q_out and the new K/V rows written.
    const double bytes = double(T) * (row + size_t(kHq) * kD + 2 * size_t(kHkv) * kD) * 2;
    std::printf("qk_norm_rope_kv %d tokens: %.2f us per launch in a graph (%.2f TB/s)\n", T, us,
                bytes / us * 1e-6);
  }
}

}  // namespace
}  // namespace serval::testing
