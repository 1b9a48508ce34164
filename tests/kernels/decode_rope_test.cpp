// paged_attention_rope (the decode kernel doing qk_norm_rope_kv's work itself) against its
// two-kernel twin, qk_norm_rope_kv then paged_attention, which the other tests check against the
// CPU: the same output bits and the same cache bytes. Cases: bf16, e4m3 and e5m2 caches, with and
// without q/k norm, GQA groups of 8 and of 20 (two CTAs per KV head), head dims 128, 64 and 32,
// new keys in the first tile, at tile edges and deep in split contexts, positions past sincosf's
// fast range, under the exact context bound and a graph-sized one (many splits, fused merge).
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

void check(const RopeCase& rc, const std::vector<int>& ctx_lens, int bound) {
  SCOPED_TRACE(std::string(rc.name) + ", bound " + std::to_string(bound));
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
  const PagedLayout& l = pr.layout;
  const int S = int(l.ctx_lens.size()), D = rc.d;

  // The step's fused QKV rows; each sequence's token is its key ctx − 1, in that key's slot.
  const size_t row = size_t(rc.hq + 2 * rc.hkv) * D;
  DeviceBuffer<bf16> qkv(random_bf16(size_t(S) * row, 21, -2.0f, 2.0f));
  std::vector<int32_t> positions(S), slots(S);
  for (int s = 0; s < S; ++s) {
    const int key = l.ctx_lens[s] - 1;
    positions[s] = key + rc.position_offset;
    slots[s] =
        l.tables[size_t(s) * l.max_blocks + key / l.block_size] * l.block_size + key % l.block_size;
  }
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = float(1.0 / std::pow(1e6, 2.0 * i / D));
  DeviceBuffer<int32_t> d_positions(positions), d_slots(slots);
  DeviceBuffer<float> d_freq(inv_freq);
  DeviceBuffer<bf16> q_norm(random_bf16(D, 22, 0.5f, 1.5f)), k_norm(random_bf16(D, 23, 0.5f, 1.5f));
  DeviceBuffer<bf16> q_out(size_t(S) * rc.hq * D);
  kc::QkNormRopeKvParams r{};
  r.qkv = qkv.get();
  r.q_norm = rc.norm ? q_norm.get() : nullptr;
  r.k_norm = rc.norm ? k_norm.get() : nullptr;
  r.positions = d_positions.get();
  r.inv_freq = d_freq.get();
  r.slot_mapping = d_slots.get();
  r.q_out = q_out.get();
  r.k_cache = dev.k.get();
  r.v_cache = dev.v.get();
  r.num_tokens = S;
  r.num_q_heads = rc.hq;
  r.num_kv_heads = rc.hkv;
  r.head_dim = D;
  r.eps = 1e-6f;
  r.cache_dtype = rc.dtype;
  r.k_scale = is_fp8(rc.dtype) ? 1.5f / cache_max(rc.dtype) : 1.0f;
  r.v_scale = pr.v_scale;

  // The twin: qk_norm_rope_kv, then paged_attention on its q.
  dev.poison();
  kc::qk_norm_rope_kv(r, nullptr);
  dev.params.q = q_out.get();
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
  DeviceBuffer<bf16> qkv(random_bf16(size_t(6) * 64, 4));
  DeviceBuffer<int32_t> position(std::vector<int32_t>{4});
  DeviceBuffer<int32_t> slot(std::vector<int32_t>{pr.layout.tables[0] * pr.layout.block_size + 4});
  DeviceBuffer<float> freq(std::vector<float>(32, 1.0f));
  kc::QkNormRopeKvParams r{};
  r.qkv = qkv.get();
  r.positions = position.get();
  r.inv_freq = freq.get();
  r.slot_mapping = slot.get();
  r.k_cache = dev.k.get();
  r.v_cache = dev.v.get();
  r.num_tokens = 1;
  r.num_q_heads = 4;
  r.num_kv_heads = 1;
  r.head_dim = 64;
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
