// CUDA paged attention over an fp8 (e4m3, e5m2) KV cache against the CPU paged_attention reading
// the same fp8 cache bytes (cache_dtype set, scale = softmax scale · k_scale, v_scale ≠ 1), on
// random non-contiguous block tables with unused cache slots poisoned (0xFF: NaN in both
// formats). Decode split-KV and prefill paths, GQA 1/4/8 (and 20), contexts up to 4096. Every
// case runs through run_paged_case (paged_case_util.h).
#include <gtest/gtest.h>

#include "base/error.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/paged_case_util.h"

namespace serval::testing {
namespace {

// The fp8 values are exact inputs of both sides (the GPU converts them exactly to f16); only the
// rounding of q (bf16 → f16, exact here) and of P (f16), the bf16 output and the accumulation
// order differ: a few 1e-3 rel L2. 2e-2 still catches any masking, indexing or conversion bug
// (one wrong code per row would show).
constexpr double kTol = 2e-2;

const char* name(DType t) {
  return t == DType::kF8E4M3 ? "e4m3" : "e5m2";
}

TEST(CudaPagedAttentionFp8, DecodeMatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 1;
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int d : {64, 128}) {
      for (int group : {1, 4, 8}) {
        PagedCase fixed{{1, 1, 1}, {1, 1000, 4096}, 2 * group, 2, d, t};
        fixed.max_context_bound = 4096;  // a fixed bound, as under CUDA graphs: empty splits
        EXPECT_LT(run_paged_case(fixed, seed++), kTol)
            << name(t) << " D=" << d << " group=" << group;
        PagedCase exact{{1, 1}, {17, 4096}, 2 * group, 2, d, t};  // bound = the real max
        EXPECT_LT(run_paged_case(exact, seed++), kTol)
            << name(t) << " exact bound D=" << d << " group=" << group;
      }
    }
  }
}

TEST(CudaPagedAttentionFp8, DecodeBatch64AndOddShapes) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::vector<int> contexts = {1, 17, 1000, 4096};
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    PagedCase c{std::vector<int>(64, 1), {}, 16, 2, 128, t};  // group 8
    for (int i = 0; i < 64; ++i) c.ctx_lens.push_back(contexts[i % 4]);
    c.max_context_bound = 4096;
    EXPECT_LT(run_paged_case(c, 700), kTol) << name(t) << " batch 64";
    PagedCase big{{1, 1, 1}, {5, 700, 64}, 40,
                  2,         64,           t};  // group 20 > 16 rows: two CTAs per kv head
    EXPECT_LT(run_paged_case(big, 701), kTol) << name(t) << " group 20";
    PagedCase bs32{{1, 1}, {33, 500}, 8, 8, 128, t};
    bs32.block_size = 32;
    EXPECT_LT(run_paged_case(bs32, 702), kTol) << name(t) << " block_size 32";
  }
}

// fp8 decode builds its mma fragments from the staged bytes (permuted dims, 4-stage pipeline):
// many uneven splits under a loose bound, and one unsplit batch streaming 8 tiles per CTA.
TEST(CudaPagedAttentionFp8, DecodeManySplitsAndUnsplitBatch) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int d : {64, 128}) {
      PagedCase loose{{1, 1, 1}, {8191, 300, 64}, 16, 2, d, t};
      loose.max_context_bound = 32768;
      EXPECT_LT(run_paged_case(loose, 720 + d), kTol) << name(t) << " bound 32768 D=" << d;
    }
    PagedCase full{std::vector<int>(64, 1), std::vector<int>(64, 512), 32, 4, 128, t};
    full.ctx_lens[5] = 500;  // one sequence ending inside a tile
    EXPECT_LT(run_paged_case(full, 730), kTol) << name(t) << " batch 64 ctx 512";
  }
}

// Short and medium contexts at batch 1 and 3, exact and loose bounds (see the bf16 test of the
// same name): one active split, and splits of the fp8 floor of four tiles merged by the last CTA
// (ctx 1024: 4 splits of 256 keys).
TEST(CudaPagedAttentionFp8, DecodeShortAndMediumContexts) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::vector<int> contexts = {1, 15, 16, 17, 56, 300, 1024};
  const int n = int(contexts.size());
  uint32_t seed = 900;
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int bound : {0, 1024, 40960}) {
      for (int batch : {1, 3}) {
        for (int i = 0; i < n; ++i) {
          PagedCase c{std::vector<int>(batch, 1), {}, 32, 4, 128, t};
          for (int b = 0; b < batch; ++b) c.ctx_lens.push_back(contexts[(i + 2 * b) % n]);
          c.max_context_bound = bound;
          EXPECT_LT(run_paged_case(c, seed++), kTol)
              << name(t) << " bound=" << bound << " batch=" << batch << " ctx0=" << c.ctx_lens[0];
        }
      }
    }
    PagedCase d64{{1, 1, 1}, {17, 300, 1024}, 8, 2, 64, t};  // D 64, group 4
    d64.max_context_bound = 40960;
    EXPECT_LT(run_paged_case(d64, seed++), kTol) << name(t) << " D64";
  }
}

TEST(CudaPagedAttentionFp8, PrefillMatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 800;
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int d : {64, 128}) {
      for (int group : {1, 4, 8}) {
        // Chunked prefill with prior context, mixed with decode rows (q_len 1).
        PagedCase mixed{{5, 64, 1, 200, 130, 1}, {5, 164, 4000, 237, 1030, 17}, 2 * group, 2, d, t};
        EXPECT_LT(run_paged_case(mixed, seed++), kTol)
            << name(t) << " mixed D=" << d << " group=" << group;
      }
      for (int len : {2, 63, 65, 600}) {
        PagedCase single{{len}, {len}, 8, 2, d, t};
        EXPECT_LT(run_paged_case(single, seed++), kTol) << name(t) << " D=" << d << " len=" << len;
      }
      PagedCase tail{{40, 20}, {4096, 2100}, 8, 2, d, t};  // the last chunks of long prompts
      EXPECT_LT(run_paged_case(tail, seed++), kTol) << name(t) << " ctx 4096 D=" << d;
    }
  }
}

TEST(CudaPagedAttentionFp8, RejectsUnsupported) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  DeviceBuffer<uint8_t> cache(64 * 16);
  kernels::cuda::PagedAttentionParams p{};
  p.k_cache = p.v_cache = cache.get();
  p.num_tokens = p.num_seqs = 1;
  p.block_size = 16;
  p.num_q_heads = p.num_kv_heads = 1;
  p.max_query_len = p.max_context_len = 1;
  p.head_dim = 32;  // fp8 kernels exist for head_dim 64 and 128 only
  p.cache_dtype = DType::kF8E4M3;
  EXPECT_THROW(kernels::cuda::paged_attention(p, nullptr), InvalidArgument);
  p.head_dim = 64;
  p.cache_dtype = DType::kF32;
  EXPECT_THROW(kernels::cuda::paged_attention(p, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace serval::testing
