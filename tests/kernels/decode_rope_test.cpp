// paged_attention_rope (the decode kernel doing qk_norm_rope_kv's work itself) against its
// two-kernel twin, qk_norm_rope_kv then paged_attention, which the other tests check against the
// CPU: the same output bits and the same cache bytes. Cases: bf16, e4m3 and e5m2 caches, with and
// without q/k norm, GQA groups of 8 and of 20 (two CTAs per KV head), head dims 128, 64 and 32,
// new keys in the first tile, at tile edges and deep in split contexts, positions past sincosf's
// fast range, under the exact context bound and a graph-sized one (many splits, fused merge), on
// both decode CTAs (the 4-warp one and the 8-warp one of small grids).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/paged_case_util.h"

namespace serval::testing {
namespace {

namespace kc = kernels::cuda;

struct RopeCase {
  const char* name;
  int hq, hkv, d;
  DType dtype;
  bool norm;
  int position_offset;  // positions[s] = ctx − 1 + offset (RoPE only; the key is still ctx − 1)
};

size_t count_differing(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t n = a.size() == b.size() ? 0 : SIZE_MAX;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] != b[i];
  return n;
}

// Each decode sequence's token is its key ctx − 1, at position ctx − 1 + offset.
std::vector<int32_t> token_positions(const PagedLayout& l, int offset) {
  std::vector<int32_t> positions;
  for (int ctx : l.ctx_lens) positions.push_back(ctx - 1 + offset);
  return positions;
}

// That key's cache slot.
std::vector<int32_t> token_slots(const PagedLayout& l) {
  std::vector<int32_t> slots;
  for (size_t s = 0; s < l.ctx_lens.size(); ++s) {
    slots.push_back(int32_t(slot_of(l, s, l.ctx_lens[s] - 1)));
  }
  return slots;
}

std::vector<float> inv_freqs(int d) {
  std::vector<float> f(d / 2);
  for (int i = 0; i < d / 2; ++i) f[i] = float(1.0 / std::pow(1e6, 2.0 * i / d));
  return f;
}

// The rope inputs of decode problem pr (one token per sequence): random fused QKV rows in
// [-2, 2), positions, slots, frequencies, norm weights (used when `norm`) and a q_out buffer,
// owned here; `r` points into them and at dev's caches, with pr's scales (fp8: k_scale as
// make_paged_problem's). Neither copied nor moved.
struct RopeInputs {
  RopeInputs(const PagedProblem& pr, const PagedDeviceProblem& dev, bool norm, int position_offset)
      : qkv(random_bf16(
            pr.layout.ctx_lens.size() * size_t(pr.num_q_heads + 2 * pr.num_kv_heads) * pr.head_dim,
            21, -2.0f, 2.0f)),
        q_norm(random_bf16(pr.head_dim, 22, 0.5f, 1.5f)),
        k_norm(random_bf16(pr.head_dim, 23, 0.5f, 1.5f)),
        q_out(pr.layout.ctx_lens.size() * pr.num_q_heads * pr.head_dim),
        positions(token_positions(pr.layout, position_offset)),
        slots(token_slots(pr.layout)),
        inv_freq(inv_freqs(pr.head_dim)) {
    r.qkv = qkv.get();
    r.q_norm = norm ? q_norm.get() : nullptr;
    r.k_norm = norm ? k_norm.get() : nullptr;
    r.positions = positions.get();
    r.inv_freq = inv_freq.get();
    r.slot_mapping = slots.get();
    r.q_out = q_out.get();
    r.k_cache = dev.k.get();
    r.v_cache = dev.v.get();
    r.num_tokens = int(pr.layout.ctx_lens.size());
    r.num_q_heads = pr.num_q_heads;
    r.num_kv_heads = pr.num_kv_heads;
    r.head_dim = pr.head_dim;
    r.eps = 1e-6f;
    r.cache_dtype = pr.cache_dtype;
    r.k_scale = is_fp8(pr.cache_dtype) ? 1.5f / cache_max(pr.cache_dtype) : 1.0f;
    r.v_scale = pr.v_scale;
  }
  DeviceBuffer<bf16> qkv, q_norm, k_norm, q_out;
  DeviceBuffer<int32_t> positions, slots;
  DeviceBuffer<float> inv_freq;
  kc::QkNormRopeKvParams r{};
};

// Both kernels on the same decode CTA (the CTAs differ in fp32 summation order).
void check(const RopeCase& rc, const std::vector<int>& ctx_lens, int bound, kc::DecodeCta cta) {
  SCOPED_TRACE(std::string(rc.name) + ", bound " + std::to_string(bound) +
               (cta == kc::DecodeCta::kWide ? ", wide CTA" : ", 4-warp CTA"));
  PagedCase c;
  c.ctx_lens = ctx_lens;
  c.q_lens.assign(ctx_lens.size(), 1);
  c.hq = rc.hq;
  c.hkv = rc.hkv;
  c.d = rc.d;
  c.dtype = rc.dtype;
  c.max_context_bound = bound;
  const PagedProblem pr = make_paged_problem(c, uint32_t(7 + rc.d + rc.hq));
  PagedDeviceProblem dev(pr, bound);
  const RopeInputs in(pr, dev, rc.norm, rc.position_offset);
  const kc::QkNormRopeKvParams& r = in.r;
  dev.params.decode_cta = cta;

  // The twin: qk_norm_rope_kv, then paged_attention on its q.
  dev.poison();
  kc::qk_norm_rope_kv(r, nullptr);
  dev.params.q = in.q_out.get();
  kc::paged_attention(dev.params, nullptr);
  cuda_check(cudaDeviceSynchronize(), "two kernels");
  const std::vector<bf16> want = dev.out.download();
  const std::vector<uint8_t> want_k = dev.k.download(), want_v = dev.v.download();
  ASSERT_NE(count_differing(want_k, pr.k), 0u) << "the step appended no key";
  for (const bf16& x : want) ASSERT_TRUE(std::isfinite(bf16_to_float(x))) << "an output unwritten";

  // The fused kernel on the cache as before the step.
  dev.k.upload(pr.k);
  dev.v.upload(pr.v);
  dev.poison();
  dev.params.q = nullptr;
  kc::paged_attention_rope(dev.params, r, nullptr);
  cuda_check(cudaDeviceSynchronize(), "paged_attention_rope");
  const std::vector<bf16> got = dev.out.download();
  size_t differing = 0;
  for (size_t i = 0; i < want.size(); ++i) differing += got[i].bits != want[i].bits;
  EXPECT_EQ(differing, 0u) << "of " << want.size() << " outputs";
  EXPECT_EQ(count_differing(dev.k.download(), want_k), 0u) << "K cache bytes";
  EXPECT_EQ(count_differing(dev.v.download(), want_v), 0u) << "V cache bytes";
}

// check() on every decode CTA of the head dim.
void check(const RopeCase& rc, const std::vector<int>& ctx_lens, int bound) {
  for (kc::DecodeCta cta : decode_ctas(rc.d)) check(rc, ctx_lens, bound, cta);
}

const std::vector<int> kContexts = {1, 2, 63, 64, 65, 129, 200, 1040, 2000, 4097};

TEST(DecodeRope, EqualsRopeKernelThenAttention) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const RopeCase cases[] = {
      {"bf16 16/2 x128", 16, 2, 128, DType::kBF16, false, 0},
      {"e4m3 16/2 x128 norm", 16, 2, 128, DType::kF8E4M3, true, 0},
      {"e5m2 16/2 x64 norm", 16, 2, 64, DType::kF8E5M2, true, 0},
      {"e4m3 40/2 x128 (two CTAs per KV head)", 40, 2, 128, DType::kF8E4M3, true, 0},
      {"bf16 40/2 x64 far positions", 40, 2, 64, DType::kBF16, false, 150000},
      {"bf16 8/2 x32 norm", 8, 2, 32, DType::kBF16, true, 0},
  };
  for (const RopeCase& rc : cases) {
    check(rc, kContexts, 0);
    check(rc, kContexts, 40960);
  }
}

TEST(DecodeRope, LlamaAndQwen3ShapesAtBatch8) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::vector<int> ctx = {1025, 1026, 1030, 1040, 1041, 1056, 1088, 1100};
  check({"Llama-3.3-70B e4m3", 64, 8, 128, DType::kF8E4M3, false, 0}, ctx, 131072);
  check({"Qwen3-30B-A3B e4m3", 32, 4, 128, DType::kF8E4M3, true, 0}, ctx, 40960);
  check({"Qwen3-30B-A3B bf16 b1", 32, 4, 128, DType::kBF16, true, 0}, {145}, 40960);
}

TEST(DecodeRope, RejectsParametersThatDisagree) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  PagedCase c;
  c.ctx_lens = {5};
  c.q_lens = {1};
  c.hq = 4;
  c.hkv = 1;
  c.d = 64;
  const PagedProblem pr = make_paged_problem(c, 3);
  PagedDeviceProblem dev(pr, 0);
  const RopeInputs in(pr, dev, false, 0);
  const kc::QkNormRopeKvParams& r = in.r;
  dev.params.q = nullptr;
  auto expect_error = [&](kc::QkNormRopeKvParams bad, const char* part) {
    try {
      kc::paged_attention_rope(dev.params, bad, nullptr);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  kc::QkNormRopeKvParams bad = r;
  bad.num_kv_heads = 2;
  expect_error(bad, "shape");
  bad = r;
  bad.v_cache = dev.k.get();
  expect_error(bad, "caches");
  bad = r;
  bad.k_scale = 0.0f;
  expect_error(bad, "k_scale");
  bad = r;
  bad.positions = nullptr;
  expect_error(bad, "positions");
  kc::PagedAttentionParams prefill = dev.params;
  prefill.max_query_len = 2;
  try {
    kc::paged_attention_rope(prefill, r, nullptr);
    ADD_FAILURE() << "accepted a prefill";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("decode only"), std::string::npos) << e.what();
  }
  kc::paged_attention_rope(dev.params, r, nullptr);  // the valid parameters run
  cuda_check(cudaDeviceSynchronize(), "valid launch");
}

}  // namespace
}  // namespace serval::testing
