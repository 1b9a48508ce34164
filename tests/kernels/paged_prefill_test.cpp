// CUDA prefill paged attention (paged_prefill.cu: 128 (row, head) pairs per CTA, GQA heads packed
// per CTA, heaviest query tile first) against the CPU paged_attention: every GQA packing (q heads
// per CTA 1, 2, 4, 8 from groups 1, 2, 3, 4, 6, 8, 16, 20), query lengths on and off the 16/32/64
// /128-row tile edges, several sequences of different lengths in one launch, chunked prefill
// over a prefix (the chunk's keys span earlier chunks), block sizes 8/16/32/48, head dims
// 16/32/64/128, bf16 and fp8 caches. Unused cache slots hold NaN, so any read past a sequence's
// keys shows. Every case runs through run_paged_case (paged_case_util.h) with max_query_len ≥ 2:
// the prefill path, which takes no workspace.
#include <gtest/gtest.h>

#include "base/error.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/paged_case_util.h"

namespace serval::testing {
namespace {

// bf16 q/K/V, fp32 accumulation, probabilities rounded to bf16 (f16 for fp8 caches) in P·V and a
// bf16 output: a few 1e-3 rel L2 in practice. 2e-2 (the bound of paged_attention_test.cpp) still
// catches a wrong mask, head, block or tile (each moves whole rows by O(1)).
constexpr double kTol = 2e-2;

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
      PagedCase c{kQLens, kCtxLens, group * hkv, hkv, d};
      EXPECT_LT(run_paged_case(c, seed++), kTol) << "group=" << group << " D=" << d;
    }
  }
}

TEST(CudaPagedPrefill, TinyHeadDimsAndBlockSizes) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 2000;
  for (int d : {16, 32}) {
    for (int group : {1, 8}) {
      PagedCase c{kQLens, kCtxLens, 2 * group, 2, d};
      EXPECT_LT(run_paged_case(c, seed++), kTol) << "D=" << d << " group=" << group;
    }
  }
  // Block sizes other than 16, including one that is not a power of two: a 64-key tile spans
  // a partial block at each end.
  for (int bs : {8, 32, 48}) {
    PagedCase c{kQLens, kCtxLens, 8, 2, 128};
    c.block_size = bs;
    EXPECT_LT(run_paged_case(c, seed++), kTol) << "block_size=" << bs;
  }
}

TEST(CudaPagedPrefill, ChunkedPrefillLongPrefixAndVScale) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // Short chunks at the end of long prompts (the CTA's first key tiles are all unmasked, only
  // the last is diagonal), next to a fresh prompt; v_scale ≠ 1 scales the output.
  PagedCase c{{2, 33, 129, 64}, {2050, 1233, 129, 3000}, 32, 4, 128};
  c.v_scale = 0.75f;
  EXPECT_LT(run_paged_case(c, 3000), kTol) << "Qwen3 shape";
  // One long prompt whose query tiles span many KV tiles (heaviest tile first in the grid).
  PagedCase single{{1000}, {1000}, 16, 2, 128};
  EXPECT_LT(run_paged_case(single, 3001), kTol) << "single 1000";
  PagedCase mha{{257}, {1025}, 4, 4, 64};  // group 1: 128 positions per CTA, 768-key prefix
  EXPECT_LT(run_paged_case(mha, 3002), kTol) << "MHA chunk";
}

TEST(CudaPagedPrefill, Fp8CachesEveryPacking) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 4000;
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int group : {2, 3, 8}) {
      for (int d : {64, 128}) {
        PagedCase c{kQLens, kCtxLens, 2 * group, 2, d, t};
        EXPECT_LT(run_paged_case(c, seed++), kTol)
            << (t == DType::kF8E4M3 ? "e4m3" : "e5m2") << " group=" << group << " D=" << d;
      }
    }
    PagedCase bs32{{70, 5}, {70, 500}, 8, 2, 128, t};
    bs32.block_size = 32;
    EXPECT_LT(run_paged_case(bs32, seed++), kTol) << "block_size 32";
    PagedCase bs24{{300, 5}, {300, 700}, 8, 2, 128, t};  // the copies' division path
    bs24.block_size = 24;
    EXPECT_LT(run_paged_case(bs24, seed++), kTol) << "block_size 24";
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
