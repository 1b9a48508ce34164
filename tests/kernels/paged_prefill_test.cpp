// CUDA prefill paged attention (paged_prefill.cu: 128 (row, head) pairs per CTA, GQA heads packed
// per CTA, heaviest query tile first) against the CPU paged_attention: every GQA packing (q heads
// per CTA 1, 2, 4, 8 from groups 1, 2, 3, 4, 6, 8, 16, 20), query lengths on and off the 16/32/64
// /128-row tile edges, several sequences of different lengths in one launch, chunked prefill
// over a prefix (the chunk's keys span earlier chunks), block sizes 8/16/32/48, head dims
// 16/32/64/128, bf16 and fp8 caches. Unused cache slots hold NaN, so any read past a sequence's
// keys shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "base/math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda_test_util.h"
#include "kernels/fp8_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/paged_layout_util.h"

namespace serval::testing {
namespace {

// bf16 q/K/V, fp32 accumulation, probabilities rounded to bf16 (f16 for fp8 caches) in P·V and a
// bf16 output: a few 1e-3 rel L2 in practice. 2e-2 (the bound of paged_attention_test.cpp) still
// catches a wrong mask, head, block or tile (each moves whole rows by O(1)).
constexpr double kTol = 2e-2;

struct Case {
  std::vector<int> q_lens, ctx_lens;  // per sequence; ctx_len ≥ q_len (prefix = ctx − q)
  int hq, hkv, d;
  DType dtype = DType::kBF16;
  int block_size = 16;
  float v_scale = 1.0f;  // bf16 only; fp8 cases derive it from the format
};

double run_case(const Case& c, uint32_t seed) {
  const int S = int(c.q_lens.size()), D = c.d, bs = c.block_size;
  const bool fp8 = is_fp8(c.dtype);
  const PagedLayout layout = make_paged_layout(c.q_lens, c.ctx_lens, bs, seed);
  const std::vector<int32_t>& query_start = layout.query_start;
  const std::vector<int32_t>& tables = layout.tables;
  const std::vector<bool>& live = layout.live;
  const int T = layout.T, max_ctx = layout.max_ctx, max_q = layout.max_q;
  const int max_blocks = layout.max_blocks, num_blocks = layout.num_blocks;

  // Cache bytes; every slot no sequence owns is NaN (0xFF bytes: NaN in bf16, e4m3 and e5m2).
  const int eb = cache_elem_bytes(c.dtype);
  const size_t kv_row = size_t(c.hkv) * D, cache_elems = size_t(num_blocks) * bs * kv_row;
  const float k_scale = fp8 ? 1.5f / cache_max(c.dtype) : 1.0f;
  const float v_scale = fp8 ? 2.5f / cache_max(c.dtype) : c.v_scale;
  std::vector<uint8_t> k(cache_elems * eb), v(cache_elems * eb);
  if (fp8) {
    k = random_fp8(cache_elems, c.dtype, seed + 1, k_scale);
    v = random_fp8(cache_elems, c.dtype, seed + 2, v_scale);
  } else {
    const auto kb = random_bf16(cache_elems, seed + 1), vb = random_bf16(cache_elems, seed + 2);
    std::memcpy(k.data(), kb.data(), k.size());
    std::memcpy(v.data(), vb.data(), v.size());
  }
  for (size_t slot = 0; slot < live.size(); ++slot) {
    if (live[slot]) continue;
    std::memset(k.data() + slot * kv_row * eb, 0xFF, kv_row * eb);
    std::memset(v.data() + slot * kv_row * eb, 0xFF, kv_row * eb);
  }
  auto q = random_bf16(size_t(T) * c.hq * D, seed + 3, -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(float(D)) * k_scale;  // k_scale folded in (caller's job)

  // CPU oracle on the same values: bf16 caches widened to f32, fp8 caches read as bytes.
  std::vector<float> q_f = to_float(q), want(q.size()), k_f, v_f;
  kernels::PagedAttentionParams cp{};
  if (fp8) {
    cp.k_cache = k.data();
    cp.v_cache = v.data();
    cp.cache_dtype = c.dtype;
  } else {
    k_f.resize(cache_elems);
    v_f.resize(cache_elems);
    for (size_t i = 0; i < cache_elems; ++i) {
      k_f[i] = cache_decode(DType::kBF16, k, i);
      v_f[i] = cache_decode(DType::kBF16, v, i);
    }
    cp.k_cache = k_f.data();
    cp.v_cache = v_f.data();
    cp.cache_dtype = DType::kF32;
  }
  cp.q = q_f.data();
  cp.out = want.data();
  cp.query_start = query_start.data();
  cp.context_lens = c.ctx_lens.data();
  cp.block_tables = tables.data();
  cp.num_seqs = S;
  cp.max_blocks_per_seq = max_blocks;
  cp.block_size = bs;
  cp.num_q_heads = c.hq;
  cp.num_kv_heads = c.hkv;
  cp.head_dim = D;
  cp.scale = scale;
  cp.v_scale = v_scale;
  kernels::cpu::paged_attention(cp);

  DeviceBuffer<bf16> d_q(q), d_out(q.size());
  DeviceBuffer<uint8_t> d_k(k), d_v(v);
  DeviceBuffer<int32_t> d_qs(query_start),
      d_ctx(std::vector<int32_t>(c.ctx_lens.begin(), c.ctx_lens.end())), d_tables(tables);
  d_out.poison();
  kernels::cuda::PagedAttentionParams p{};
  p.q = d_q.get();
  p.out = d_out.get();
  p.k_cache = d_k.get();
  p.v_cache = d_v.get();
  p.query_start = d_qs.get();
  p.context_lens = d_ctx.get();
  p.block_tables = d_tables.get();
  p.num_tokens = T;
  p.num_seqs = S;
  p.max_blocks_per_seq = max_blocks;
  p.block_size = bs;
  p.num_q_heads = c.hq;
  p.num_kv_heads = c.hkv;
  p.head_dim = D;
  p.max_query_len = max_q;
  p.max_context_len = max_ctx;
  p.scale = scale;
  p.v_scale = v_scale;
  p.cache_dtype = c.dtype;
  // max_query_len ≥ 2 in every case: the prefill path, no workspace.
  kernels::cuda::paged_attention(p, nullptr);
  return rel_l2(d_out.download(), want);
}

// Sequences of different lengths in one launch: q lengths off every tile edge (1, 17, 100),
// exact multiples (16, 128), prefixes (chunked prefill) from 0 to 900 keys.
const std::vector<int> kQLens = {17, 128, 1, 100, 16, 300};
const std::vector<int> kCtxLens = {40, 128, 901, 100, 16, 700};

TEST(CudaPagedPrefill, GqaPackingsAndHeadDims) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 1000;
  // group → q heads per CTA: 1 → 1, 2 → 2, 3 → 1, 4 → 4, 6 → 2, 8 → 8, 16 → 8, 20 → 4.
  for (int group : {1, 2, 3, 4, 6, 8, 16, 20}) {
    for (int d : {64, 128}) {
      const int hkv = group >= 16 ? 1 : 2;
      Case c{kQLens, kCtxLens, group * hkv, hkv, d};
      EXPECT_LT(run_case(c, seed++), kTol) << "group=" << group << " D=" << d;
    }
  }
}

TEST(CudaPagedPrefill, TinyHeadDimsAndBlockSizes) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 2000;
  for (int d : {16, 32}) {
    for (int group : {1, 8}) {
      Case c{kQLens, kCtxLens, 2 * group, 2, d};
      EXPECT_LT(run_case(c, seed++), kTol) << "D=" << d << " group=" << group;
    }
  }
  // Block sizes other than 16, including one that is not a power of two: a 64-key tile spans
  // a partial block at each end.
  for (int bs : {8, 32, 48}) {
    Case c{kQLens, kCtxLens, 8, 2, 128};
    c.block_size = bs;
    EXPECT_LT(run_case(c, seed++), kTol) << "block_size=" << bs;
  }
}

TEST(CudaPagedPrefill, ChunkedPrefillLongPrefixAndVScale) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // Short chunks at the end of long prompts (the CTA's first key tiles are all unmasked, only
  // the last is diagonal), next to a fresh prompt; v_scale ≠ 1 scales the output.
  Case c{{2, 33, 129, 64}, {2050, 1233, 129, 3000}, 32, 4, 128};
  c.v_scale = 0.75f;
  EXPECT_LT(run_case(c, 3000), kTol) << "Qwen3 shape";
  // One long prompt whose query tiles span many KV tiles (heaviest tile first in the grid).
  Case single{{1000}, {1000}, 16, 2, 128};
  EXPECT_LT(run_case(single, 3001), kTol) << "single 1000";
  Case mha{{257}, {1025}, 4, 4, 64};  // group 1: 128 positions per CTA, 768-key prefix
  EXPECT_LT(run_case(mha, 3002), kTol) << "MHA chunk";
}

TEST(CudaPagedPrefill, Fp8CachesEveryPacking) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 4000;
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int group : {2, 3, 8}) {
      for (int d : {64, 128}) {
        Case c{kQLens, kCtxLens, 2 * group, 2, d, t};
        EXPECT_LT(run_case(c, seed++), kTol)
            << (t == DType::kF8E4M3 ? "e4m3" : "e5m2") << " group=" << group << " D=" << d;
      }
    }
    Case bs32{{70, 5}, {70, 500}, 8, 2, 128, t};
    bs32.block_size = 32;
    EXPECT_LT(run_case(bs32, seed++), kTol) << "block_size 32";
  }
}

TEST(CudaPagedPrefill, RejectsNonPositiveScale) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  DeviceBuffer<uint8_t> cache(64 * 16 * 2);
  kernels::cuda::PagedAttentionParams p{};
  p.k_cache = p.v_cache = cache.get();
  p.num_tokens = 2;
  p.num_seqs = 1;
  p.block_size = 16;
  p.num_q_heads = p.num_kv_heads = 1;
  p.head_dim = 64;
  p.max_query_len = p.max_context_len = 2;
  p.scale = 0.0f;  // the prefill kernel's running max assumes scale > 0
  EXPECT_THROW(kernels::cuda::paged_attention(p, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace serval::testing
