// The q/k/v decode GEMV with the RoPE + KV-append epilogue (quant_gemv_rope_kv) against the
// unfused path on the same rotary-pair tiled weight: quant_gemv into a bf16 [m, n] output, then
// qk_norm_rope_kv reading the tiled order. q_out and both caches must be identical bit for bit
// (the epilogue rounds the outputs to bf16 before rotating, as the unfused path stores them).
// Shapes cover the GEMV's three reductions on an H200 (quant_gemv_split.h at 28 resident warps
// per SM): one split (133 tiles of 4 k blocks), in-CTA splits (48 tiles; Llama-70B's 320) and
// cross-CTA splits (133 tiles of 128 k blocks). Against an independent oracle too: the CPU
// quant_linear on the checkpoint-order weight, then the CPU qk_norm_rope_kv (bf16 caches, rel L2
// 1e-2: bf16 roundings of fp32 math). Also the host-side packing of a marked weight.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/quantized_pack.h"
#include "kernels/cpu/qk_norm_rope_kv.h"
#include "kernels/cuda/gemm/quant_gemv.h"
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/quant_test_weight.h"

namespace serval::testing {
namespace {

struct QkvShape {
  int hq, hkv, d, k;
};

constexpr int kBlockSize = 16, kNumBlocks = 8, kSlots = kBlockSize * kNumBlocks;

size_t elem_bytes(DType c) {
  return c == DType::kBF16 ? 2 : 1;
}

// One case's inputs on the device: x [m, k], positions, slots (token 1 is padding when m ≥ 3),
// inv_freq.
struct RopeInputs {
  std::vector<bf16> x;
  std::vector<int32_t> positions, slots;
  std::vector<float> inv_freq;
};

RopeInputs make_inputs(int m, int k, int d, uint32_t seed) {
  RopeInputs in;
  in.x = random_bf16(size_t(m) * k, seed);
  std::mt19937 rng(seed + 1);
  in.positions.resize(size_t(m));
  for (auto& p : in.positions) p = int32_t(rng() % 40000);
  std::vector<int32_t> all(kSlots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  in.slots.assign(all.begin(), all.begin() + m);
  if (m >= 3) in.slots[1] = -1;
  in.inv_freq.resize(size_t(d / 2));
  for (int i = 0; i < d / 2; ++i) in.inv_freq[i] = float(1.0 / std::pow(5e5, 2.0 * i / d));
  return in;
}

// q_out and both caches of one run, as bytes; every buffer starts poisoned (0xFF).
struct RopeOutputs {
  std::vector<bf16> q;
  std::vector<uint8_t> k, v;
};

RopeOutputs run_case(const kc::QuantGemmWeight& w, const QkvShape& s, const RopeInputs& in,
                     DType cache, bool fused) {
  const int m = int(in.positions.size());
  DeviceBuffer<bf16> x(in.x), q(size_t(m) * s.hq * s.d), y(size_t(m) * w.n);
  const size_t cache_bytes = size_t(kSlots) * s.hkv * s.d * elem_bytes(cache);
  DeviceBuffer<uint8_t> kc_buf(cache_bytes), vc_buf(cache_bytes);
  DeviceBuffer<int32_t> pos(in.positions), slots(in.slots);
  DeviceBuffer<float> freq(in.inv_freq);
  q.poison();
  kc_buf.poison();
  vc_buf.poison();
  kc::QuantGemmParams p{};
  p.x = x.get();
  p.w = w;
  p.m = m;
  const float k_scale = cache == DType::kBF16 ? 1.0f : 0.0625f, v_scale = 0.125f;
  if (fused) {
    kc::GemvRopeKv r{};
    r.positions = pos.get();
    r.inv_freq = freq.get();
    r.slot_mapping = slots.get();
    r.q_out = q.get();
    r.k_cache = kc_buf.get();
    r.v_cache = vc_buf.get();
    r.num_q_heads = s.hq;
    r.num_kv_heads = s.hkv;
    r.head_dim = s.d;
    r.cache_dtype = cache;
    r.k_scale = k_scale;
    r.v_scale = cache == DType::kBF16 ? 1.0f : v_scale;
    EXPECT_TRUE(kc::quant_gemv_rope_kv_supported(p, r));
    kc::quant_gemv_rope_kv(p, r, nullptr);
  } else {
    p.y = y.get();
    kc::quant_gemv(p, nullptr);
    kc::QkNormRopeKvParams r{};
    r.qkv = y.get();
    r.positions = pos.get();
    r.inv_freq = freq.get();
    r.slot_mapping = slots.get();
    r.q_out = q.get();
    r.k_cache = kc_buf.get();
    r.v_cache = vc_buf.get();
    r.num_tokens = m;
    r.num_q_heads = s.hq;
    r.num_kv_heads = s.hkv;
    r.head_dim = s.d;
    r.cache_dtype = cache;
    r.k_scale = k_scale;
    r.v_scale = cache == DType::kBF16 ? 1.0f : v_scale;
    r.qk_rows_tiled = true;
    kc::qk_norm_rope_kv(r, nullptr);
  }
  cuda_check(cudaDeviceSynchronize(), "rope case");
  return {q.download(), kc_buf.download(), vc_buf.download()};
}

// The CPU oracle on the checkpoint-order weight (bf16 caches: f32 values).
struct OracleOutputs {
  std::vector<float> q, k, v;  // caches NaN where not written
};

OracleOutputs cpu_oracle(const TestWeight& tw, const QkvShape& s, const RopeInputs& in) {
  const int m = int(in.positions.size());
  const std::vector<float> xf = to_float(in.x);
  std::vector<float> qkv(size_t(m) * tw.n);
  kernels::QuantLinearParams cp = cpu_params(tw);
  cp.x = xf.data();
  cp.y = qkv.data();
  cp.m = m;
  kernels::cpu::quant_linear(cp);
  OracleOutputs o;
  const size_t kv = size_t(kSlots) * s.hkv * s.d;
  o.q.resize(size_t(m) * s.hq * s.d);
  o.k.assign(kv, NAN);
  o.v.assign(kv, NAN);
  kernels::cpu::qk_norm_rope_kv({qkv.data(), nullptr, nullptr, in.positions.data(),
                                 in.inv_freq.data(), in.slots.data(), o.q.data(), o.k.data(),
                                 o.v.data(), m, s.hq, s.hkv, s.d, 1e-6f});
  return o;
}

// The written slots of a bf16 cache (bytes) and of the oracle's, as two float vectors.
void written_values(const std::vector<uint8_t>& got, const std::vector<float>& want,
                    const RopeInputs& in, const QkvShape& s, std::vector<float>& g,
                    std::vector<float>& w) {
  const size_t row = size_t(s.hkv) * s.d;
  for (int32_t slot : in.slots) {
    if (slot < 0) continue;
    for (size_t i = 0; i < row; ++i) {
      bf16 b;
      std::memcpy(&b.bits, got.data() + 2 * (size_t(slot) * row + i), 2);
      g.push_back(bf16_to_float(b));
      w.push_back(want[size_t(slot) * row + i]);
    }
  }
}

TEST(QuantGemvRopeKv, EqualsGemvThenRopeKernelBitExactly) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const QkvShape shapes[] = {
      {8, 2, 128, 1024},   // 48 tiles of 16 k blocks: in-CTA splits
      {125, 4, 32, 256},   // 133 tiles of 4: one split
      {125, 4, 32, 8192},  // 133 tiles of 128: cross-CTA splits
      {64, 8, 128, 8192},  // Llama-70B: 320 tiles of 128
  };
  const DType caches[] = {DType::kBF16, DType::kF8E4M3, DType::kF8E5M2};
  uint32_t seed = 900;
  int variant = 0;
  for (WeightFormat format :
       {WeightFormat::kNvfp4, WeightFormat::kFp8PerTensor, WeightFormat::kFp8PerChannel}) {
    for (const QkvShape& s : shapes) {
      const int n = (s.hq + 2 * s.hkv) * s.d;
      const TestWeight tw = make_weight(format, n, s.k, seed++);
      const DeviceWeight dw(rope_tiled_rows(tw, s.hq + s.hkv, s.d));
      for (int m : {1, 3, 8}) {
        const DType cache = caches[variant++ % 3];
        SCOPED_TRACE(::testing::Message()
                     << format_name(format) << " hq " << s.hq << " hkv " << s.hkv << " d " << s.d
                     << " k " << s.k << " m " << m << " cache " << dtype_name(cache));
        const RopeInputs in = make_inputs(m, s.k, s.d, seed++);
        const RopeOutputs fused = run_case(dw.w, s, in, cache, true);
        const RopeOutputs split = run_case(dw.w, s, in, cache, false);
        ASSERT_EQ(fused.q.size(), split.q.size());
        EXPECT_EQ(std::memcmp(fused.q.data(), split.q.data(), fused.q.size() * 2), 0) << "q_out";
        EXPECT_TRUE(fused.k == split.k) << "k cache";
        EXPECT_TRUE(fused.v == split.v) << "v cache";
        if (cache != DType::kBF16 || s.k > 1024) continue;  // the oracle: small bf16 cases
        const OracleOutputs want = cpu_oracle(tw, s, in);
        EXPECT_LT(rel_l2(fused.q, want.q), 1e-2) << "q_out vs CPU";
        std::vector<float> gk, wk, gv, wv;
        written_values(fused.k, want.k, in, s, gk, wk);
        written_values(fused.v, want.v, in, s, gv, wv);
        EXPECT_LT(rel_l2(gk, wk), 1e-2) << "k cache vs CPU";
        EXPECT_LT(rel_l2(gv, wv), 1e-2) << "v cache vs CPU";
      }
    }
  }
}

// Host-only: the rotary-pair tiling is a permutation of the q/k rows that puts dims i and
// i + D/2 of a head 16 rows apart in one 32-row tile (quant_gemm_rope_tiled_column is its inverse),
// and a marked weight is packed exactly as its rows permuted into that order would be unmarked; FP8
// block weights and head_dim % 32 != 0 stay in checkpoint order.
TEST(QuantGemmPack, RopeWeightsArePackedTiled) {
  for (int d : {32, 64, 128}) {
    const int heads = 3, rope_rows = heads * d, n = rope_rows + 2 * d;
    std::vector<int> seen(size_t(n), 0);
    for (int r = 0; r < n; ++r) {
      const int src = kc::quant_gemm_rope_source_row(r, d, rope_rows);
      ASSERT_GE(src, 0);
      ASSERT_LT(src, n);
      ++seen[size_t(src)];
      if (r >= rope_rows) {
        EXPECT_EQ(src, r) << "v rows keep their order";
        continue;
      }
      EXPECT_EQ(src / d, r / d) << "rows stay in their head";
      EXPECT_EQ(kc::quant_gemm_rope_tiled_column(src % d, d), r % d) << "the inverse";
      if (r % 32 < 16) {
        EXPECT_EQ(kc::quant_gemm_rope_source_row(r + 16, d, rope_rows), src + d / 2)
            << "row " << r << "'s rotary partner";
      }
    }
    for (int c : seen) EXPECT_EQ(c, 1) << "d " << d << ": not a permutation";
  }
  uint32_t seed = 950;
  for (WeightFormat format :
       {WeightFormat::kNvfp4, WeightFormat::kFp8PerChannel, WeightFormat::kFp8PerTensor}) {
    SCOPED_TRACE(format_name(format));
    const TestWeight tw = make_weight(format, 4 * 64, 128, seed++);  // 2 + 2·1 heads of 64
    backend::QuantizedWeight qkv = host_weight(tw);
    qkv.rope_heads = 3;
    qkv.rope_head_dim = 64;
    const backend::cuda::PackedLinear got = backend::cuda::pack_quantized_linear(qkv);
    const backend::cuda::PackedLinear want =
        backend::cuda::pack_quantized_linear(host_weight(rope_tiled_rows(tw, 3, 64)));
    EXPECT_TRUE(got.rows_reordered);
    EXPECT_TRUE(got.data == want.data);
    EXPECT_TRUE(got.nvfp4_scales == want.nvfp4_scales);
    EXPECT_TRUE(got.channel_scales == want.channel_scales);
    EXPECT_FALSE(got.data == backend::cuda::pack_quantized_linear(host_weight(tw)).data);
  }
  backend::QuantizedWeight d16 = host_weight(make_weight(WeightFormat::kNvfp4, 64, 128, seed++));
  d16.rope_heads = 3;
  d16.rope_head_dim = 16;
  EXPECT_FALSE(backend::cuda::pack_quantized_linear(d16).rows_reordered);
  backend::QuantizedWeight block = host_weight(make_weight(WeightFormat::kFp8Block, 256, 128, 7));
  block.rope_heads = 3;
  block.rope_head_dim = 64;
  EXPECT_FALSE(backend::cuda::tiles_rope(block));
}

}  // namespace
}  // namespace serval::testing
