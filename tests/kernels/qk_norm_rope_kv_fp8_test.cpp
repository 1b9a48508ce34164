// CUDA qk_norm_rope_kv with a scaled KV cache (fp8 e4m3/e5m2, and bf16 with scales ≠ 1) against
// the CPU twin: the CPU qk_norm_rope_kv (fp32 cache) followed by the CPU kv_append with the same
// cache dtype and k_scale/v_scale, i.e. stored = float_to_e4m3/e5m2/bf16(x · (1/scale)).
//
// Bit-exact where both sides convert the same fp32 value: every V element (a scaled copy), and
// K at position 0 without norm (RoPE is then the identity). With RoPE and norm the fp32 K values
// differ by a few ulp (sincosf vs std::sin/cos, FMA), so a stored K element may land one rounding
// step away; that is checked separately.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/qk_norm_rope_kv.h"
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"
#include "kernels/cuda_test_util.h"
#include "kernels/fp8_test_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

struct Case {
  const char* name;
  int hq, hkv, d;
  DType dtype;
  float k_scale, v_scale;
  bool rope_norm;  // false: positions 0 and no norm, so K must be bit-exact too
};

// log2 range of |x / scale| for the K/V inputs: from below half the smallest subnormal (stores
// ±0) to above the largest finite value (saturates).
void exp_range(DType t, float* lo, float* hi) {
  if (t == DType::kF8E4M3) {
    *lo = -12.0f, *hi = 9.5f;  // subnormal step 2^-9, max 448 ≈ 2^8.8
  } else if (t == DType::kF8E5M2) {
    *lo = -19.0f, *hi = 16.5f;  // subnormal step 2^-16, max 57344 ≈ 2^15.8
  } else {
    *lo = -20.0f, *hi = 20.0f;
  }
}

void check(const Case& s) {
  SCOPED_TRACE(s.name);
  const int T = 37, block_size = 16, num_blocks = 16, D = s.d;
  const int num_slots = num_blocks * block_size;
  const size_t row = size_t(s.hq + 2 * s.hkv) * D, kv_row = size_t(s.hkv) * D;
  const size_t q_dim = size_t(s.hq) * D;

  // Inputs: q uniform; k and v either log-uniform over the whole format range (exact mode) or
  // uniform (k, with RoPE + norm) / log-uniform (v).
  float lo, hi;
  exp_range(s.dtype, &lo, &hi);
  std::vector<float> qkv_f =
      to_float(random_bf16(size_t(T) * row, uint32_t(D + s.hq), -2.0f, 2.0f));
  const auto k_wide = log_uniform(size_t(T) * kv_row, uint32_t(7 + D), s.k_scale, lo, hi);
  const auto v_wide = log_uniform(size_t(T) * kv_row, uint32_t(8 + D), s.v_scale, lo, hi);
  for (int t = 0; t < T; ++t) {
    for (size_t i = 0; i < kv_row; ++i) {
      if (!s.rope_norm) qkv_f[t * row + q_dim + i] = k_wide[t * kv_row + i];
      float v = v_wide[t * kv_row + i];
      if ((t * kv_row + i) % 61 == 0) v = (i & 1) ? -0.0f : 0.0f;  // signed zeros
      qkv_f[t * row + q_dim + kv_row + i] = v;
    }
  }
  const std::vector<bf16> qkv = to_bf16(qkv_f);
  qkv_f = to_float(qkv);  // the exact values both sides read
  auto q_norm = random_bf16(D, 1, 0.5f, 1.5f), k_norm = random_bf16(D, 2, 0.5f, 1.5f);
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = float(1.0 / std::pow(1e6, 2.0 * i / D));
  std::mt19937 rng(9);
  std::vector<int32_t> positions(T, 0), slots(num_slots);
  if (s.rope_norm)
    for (auto& p : positions) p = int32_t(rng() % 40000);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(T);
  slots[3] = slots[20] = -1;  // padding tokens: no cache write

  // CPU twin: fp32 pipeline, then kv_append of the fp32 K/V rows into the real cache dtype.
  std::vector<float> qn_f = to_float(q_norm), kn_f = to_float(k_norm);
  std::vector<float> want_q(size_t(T) * q_dim), k32(size_t(num_slots) * kv_row, NAN),
      v32(size_t(num_slots) * kv_row, NAN);
  kernels::cpu::qk_norm_rope_kv({qkv_f.data(), s.rope_norm ? qn_f.data() : nullptr,
                                 s.rope_norm ? kn_f.data() : nullptr, positions.data(),
                                 inv_freq.data(), slots.data(), want_q.data(), k32.data(),
                                 v32.data(), T, s.hq, s.hkv, D, 1e-6f});
  std::vector<float> k_rows(size_t(T) * kv_row, 0.0f), v_rows(size_t(T) * kv_row, 0.0f);
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    std::copy_n(k32.begin() + slots[t] * kv_row, kv_row, k_rows.begin() + t * kv_row);
    std::copy_n(v32.begin() + slots[t] * kv_row, kv_row, v_rows.begin() + t * kv_row);
  }
  const size_t cache_bytes = size_t(num_slots) * kv_row * cache_elem_bytes(s.dtype);
  std::vector<uint8_t> want_k(cache_bytes, 0xFF), want_v(cache_bytes, 0xFF);
  kernels::cpu::kv_append({k_rows.data(), v_rows.data(), slots.data(), want_k.data(), want_v.data(),
                           T, s.hkv, D, s.dtype, s.k_scale, s.v_scale});

  DeviceBuffer<bf16> d_qkv(qkv), d_qn(q_norm), d_kn(k_norm), d_q(want_q.size());
  DeviceBuffer<uint8_t> d_k(cache_bytes), d_v(cache_bytes);
  DeviceBuffer<float> d_freq(inv_freq);
  DeviceBuffer<int32_t> d_pos(positions), d_slots(slots);
  d_q.poison();
  d_k.poison();
  d_v.poison();
  kernels::cuda::QkNormRopeKvParams p{};
  p.qkv = d_qkv.get();
  p.q_norm = s.rope_norm ? d_qn.get() : nullptr;
  p.k_norm = s.rope_norm ? d_kn.get() : nullptr;
  p.positions = d_pos.get();
  p.inv_freq = d_freq.get();
  p.slot_mapping = d_slots.get();
  p.q_out = d_q.get();
  p.k_cache = d_k.get();
  p.v_cache = d_v.get();
  p.num_tokens = T;
  p.num_q_heads = s.hq;
  p.num_kv_heads = s.hkv;
  p.head_dim = D;
  p.eps = 1e-6f;
  p.cache_dtype = s.dtype;
  p.k_scale = s.k_scale;
  p.v_scale = s.v_scale;
  kernels::cuda::qk_norm_rope_kv(p, nullptr);
  // bf16 of fp32 math (see qk_norm_rope_kv_test.cpp): 1e-2 rel L2.
  EXPECT_LT(rel_l2(d_q.download(), want_q), 1e-2) << "q_out";

  const auto got_k = d_k.download(), got_v = d_v.download();
  // V everywhere (written slots and the untouched 0xFF ones): bit-exact.
  for (size_t i = 0; i < cache_bytes; ++i) {
    ASSERT_EQ(got_v[i], want_v[i])
        << "v cache byte " << i << " (element " << i / cache_elem_bytes(s.dtype) << ")";
  }
  if (!s.rope_norm) {
    for (size_t i = 0; i < cache_bytes; ++i) {
      ASSERT_EQ(got_k[i], want_k[i])
          << "k cache byte " << i << " (element " << i / cache_elem_bytes(s.dtype) << ")";
    }
    return;
  }
  // K after RoPE + norm: untouched slots bit-exact, written elements within one rounding step of
  // the CPU's, and (a sanity bound on "a few ulp of fp32") at most 1% of them not bit-exact.
  // The step is widened by 2e-6 of the largest |k / k_scale|: RoPE's cancellation leaves an
  // absolute fp32 error of a few ulp of the row's scale (~1e-7 relative), which near zero
  // exceeds one bf16 step (fp8's subnormal step is far larger).
  std::vector<bool> written(num_slots, false);
  for (int t = 0; t < T; ++t)
    if (slots[t] >= 0) written[slots[t]] = true;
  float max_abs = 0.0f;
  for (int slot = 0; slot < num_slots; ++slot)
    for (size_t e = 0; written[slot] && e < kv_row; ++e)
      max_abs = std::max(max_abs, std::fabs(cache_decode(s.dtype, want_k, slot * kv_row + e)));
  size_t differ = 0, total = 0;
  for (int slot = 0; slot < num_slots; ++slot) {
    for (size_t e = 0; e < kv_row; ++e) {
      const size_t at = slot * kv_row + e;
      if (!written[slot]) {
        for (int b = 0; b < cache_elem_bytes(s.dtype); ++b)
          ASSERT_EQ(got_k[at * cache_elem_bytes(s.dtype) + b], 0xFF)
              << "k slot " << slot << " overwritten";
        continue;
      }
      const float g = cache_decode(s.dtype, got_k, at), w = cache_decode(s.dtype, want_k, at);
      ASSERT_TRUE(std::isfinite(g)) << "k slot " << slot << " element " << e;
      ASSERT_LE(std::fabs(g - w),
                cache_step(s.dtype, std::max(std::fabs(g), std::fabs(w))) + 2e-6f * max_abs)
          << "k slot " << slot << " element " << e << ": got " << g << ", want " << w;
      ++total;
      if (g != w) ++differ;
    }
  }
  EXPECT_LE(differ, total / 100) << differ << " of " << total << " k elements off by one step";
}

TEST(CudaQkNormRopeKvFp8, BitExactCastsOverTheWholeRange) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2, DType::kBF16}) {
    // Scales with inexact reciprocals (general rounding) and powers of two (frequent ties: bf16
    // inputs carry 8 significant bits, fp8 keeps 3-4, so RNE tie-breaking is exercised).
    check({"GQA D128 scales 0.37/2.5", 16, 4, 128, t, 0.37f, 2.5f, false});
    check({"D64 scales 0.5/4", 8, 2, 64, t, 0.5f, 4.0f, false});
    check({"tiny D16 scales 3/0.125", 4, 2, 16, t, 3.0f, 0.125f, false});
  }
}

TEST(CudaQkNormRopeKvFp8, WithRopeAndNorm) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2, DType::kBF16}) {
    check({"qwen3 Hq32 Hkv4 D128 norm, k_scale 1/64", 32, 4, 128, t, 1.0f / 64, 0.3f, true});
    check({"D64 norm, k_scale 0.02", 8, 2, 64, t, 0.02f, 1.7f, true});
  }
}

TEST(CudaQkNormRopeKvFp8, RejectsBadScalesAndDtype) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  kernels::cuda::QkNormRopeKvParams p{};
  p.num_tokens = 1;
  p.num_q_heads = p.num_kv_heads = 1;
  p.head_dim = 64;
  p.k_scale = 0.0f;
  EXPECT_THROW(kernels::cuda::qk_norm_rope_kv(p, nullptr), InvalidArgument);
  p.k_scale = 1.0f;
  p.v_scale = NAN;
  EXPECT_THROW(kernels::cuda::qk_norm_rope_kv(p, nullptr), InvalidArgument);
  p.v_scale = 1.0f;
  p.cache_dtype = DType::kF32;
  EXPECT_THROW(kernels::cuda::qk_norm_rope_kv(p, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace serval::testing
