// CUDA paged attention over an fp8 (e4m3, e5m2) KV cache against the CPU paged_attention reading
// the same fp8 cache bytes (cache_dtype set, scale = softmax scale · k_scale, v_scale ≠ 1), on
// random non-contiguous block tables with unused cache slots poisoned (0xFF: NaN in both
// formats). Decode split-KV and prefill paths, GQA 1/4/8 (and 20), contexts up to 4096.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// The fp8 values are exact inputs of both sides (the GPU converts them exactly to f16); only the
// rounding of q (bf16 → f16, exact here) and of P (f16), the bf16 output and the accumulation
// order differ: a few 1e-3 rel L2. 2e-2 still catches any masking, indexing or conversion bug
// (one wrong code per row would show).
constexpr double kTol = 2e-2;

struct Case {
  std::vector<int> q_lens, ctx_lens;
  int hq, hkv, d;
  DType dtype;
  int block_size = 16;
  int max_context_bound = 0;  // 0: the largest ctx_len
};

double run_case(const Case& c, uint32_t seed) {
  const int S = int(c.q_lens.size()), D = c.d, bs = c.block_size;
  const PagedLayout layout = make_paged_layout(c.q_lens, c.ctx_lens, bs, seed);
  const std::vector<int32_t>& query_start = layout.query_start;
  const std::vector<int32_t>& tables = layout.tables;
  const std::vector<bool>& live = layout.live;
  const int T = layout.T, max_ctx = layout.max_ctx, max_q = layout.max_q;
  const int max_blocks = layout.max_blocks, num_blocks = layout.num_blocks;

  // Real K, V magnitudes ≤ 1.5 and 2.5: scales map the format's largest value there.
  const float k_scale = 1.5f / cache_max(c.dtype), v_scale = 2.5f / cache_max(c.dtype);
  const size_t kv_row = size_t(c.hkv) * D, cache_elems = size_t(num_blocks) * bs * kv_row;
  auto k = random_fp8(cache_elems, c.dtype, seed + 1, k_scale);
  auto v = random_fp8(cache_elems, c.dtype, seed + 2, v_scale);
  for (size_t slot = 0; slot < live.size(); ++slot)
    if (!live[slot])
      for (size_t i = 0; i < kv_row; ++i) k[slot * kv_row + i] = v[slot * kv_row + i] = 0xFF;
  auto q = random_bf16(size_t(T) * c.hq * D, seed + 3, -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(float(D)) * k_scale;  // k_scale folded in (the caller's job)

  std::vector<float> q_f = to_float(q), want(q.size());
  kernels::PagedAttentionParams cp{};
  cp.q = q_f.data();
  cp.out = want.data();
  cp.k_cache = k.data();
  cp.v_cache = v.data();
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
  cp.cache_dtype = c.dtype;
  cp.v_scale = v_scale;
  kernels::cpu::paged_attention(cp);

  DeviceBuffer<bf16> d_q(q), d_out(q.size());
  DeviceBuffer<uint8_t> d_k(k), d_v(v);
  DeviceBuffer<int32_t> d_qs(query_start),
      d_ctx(std::vector<int32_t>(c.ctx_lens.begin(), c.ctx_lens.end())), d_tables(tables);
  const int bound = c.max_context_bound ? c.max_context_bound : max_ctx;
  const size_t ws_bytes =
      kernels::cuda::paged_attention_workspace_bytes(S, c.hq, c.hkv, D, max_q, bound);
  DeviceBuffer<unsigned char> d_ws(ws_bytes);
  d_ws.poison();
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
  p.max_context_len = bound;
  p.scale = scale;
  p.v_scale = v_scale;
  p.cache_dtype = c.dtype;
  p.workspace = d_ws.get();
  p.workspace_bytes = ws_bytes;
  kernels::cuda::paged_attention(p, nullptr);
  return rel_l2(d_out.download(), want);
}

const char* name(DType t) {
  return t == DType::kF8E4M3 ? "e4m3" : "e5m2";
}

TEST(CudaPagedAttentionFp8, DecodeMatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 1;
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int d : {64, 128}) {
      for (int group : {1, 4, 8}) {
        Case fixed{{1, 1, 1}, {1, 1000, 4096}, 2 * group, 2, d, t};
        fixed.max_context_bound = 4096;  // a fixed bound, as under CUDA graphs: empty splits
        EXPECT_LT(run_case(fixed, seed++), kTol) << name(t) << " D=" << d << " group=" << group;
        Case exact{{1, 1}, {17, 4096}, 2 * group, 2, d, t};  // bound = the real max
        EXPECT_LT(run_case(exact, seed++), kTol)
            << name(t) << " exact bound D=" << d << " group=" << group;
      }
    }
  }
}

TEST(CudaPagedAttentionFp8, DecodeBatch64AndOddShapes) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::vector<int> contexts = {1, 17, 1000, 4096};
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    Case c{std::vector<int>(64, 1), {}, 16, 2, 128, t};  // group 8
    for (int i = 0; i < 64; ++i) c.ctx_lens.push_back(contexts[i % 4]);
    c.max_context_bound = 4096;
    EXPECT_LT(run_case(c, 700), kTol) << name(t) << " batch 64";
    Case big{{1, 1, 1}, {5, 700, 64}, 40, 2, 64, t};  // group 20 > 16 rows: two CTAs per kv head
    EXPECT_LT(run_case(big, 701), kTol) << name(t) << " group 20";
    Case bs32{{1, 1}, {33, 500}, 8, 8, 128, t};
    bs32.block_size = 32;
    EXPECT_LT(run_case(bs32, 702), kTol) << name(t) << " block_size 32";
  }
}

// fp8 decode builds its mma fragments from the staged bytes (permuted dims, 4-stage pipeline):
// many uneven splits under a loose bound, and one unsplit batch streaming 8 tiles per CTA.
TEST(CudaPagedAttentionFp8, DecodeManySplitsAndUnsplitBatch) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int d : {64, 128}) {
      Case loose{{1, 1, 1}, {8191, 300, 64}, 16, 2, d, t};
      loose.max_context_bound = 32768;
      EXPECT_LT(run_case(loose, 720 + d), kTol) << name(t) << " bound 32768 D=" << d;
    }
    Case full{std::vector<int>(64, 1), std::vector<int>(64, 512), 32, 4, 128, t};
    full.ctx_lens[5] = 500;  // one sequence ending inside a tile
    EXPECT_LT(run_case(full, 730), kTol) << name(t) << " batch 64 ctx 512";
  }
}

// Short and medium contexts at batch 1 and 3, exact and loose bounds (see the bf16 test of the
// same name): one active split, one-tile splits merged by the last CTA, and multi-tile splits
// whose block-table entries are re-read (ctx 1024 under the bound 1024: 8 splits of 128 keys).
TEST(CudaPagedAttentionFp8, DecodeShortAndMediumContexts) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::vector<int> contexts = {1, 15, 16, 17, 56, 300, 1024};
  const int n = int(contexts.size());
  uint32_t seed = 900;
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int bound : {0, 1024, 40960}) {
      for (int batch : {1, 3}) {
        for (int i = 0; i < n; ++i) {
          Case c{std::vector<int>(batch, 1), {}, 32, 4, 128, t};
          for (int b = 0; b < batch; ++b) c.ctx_lens.push_back(contexts[(i + 2 * b) % n]);
          c.max_context_bound = bound;
          EXPECT_LT(run_case(c, seed++), kTol)
              << name(t) << " bound=" << bound << " batch=" << batch << " ctx0=" << c.ctx_lens[0];
        }
      }
    }
    Case d64{{1, 1, 1}, {17, 300, 1024}, 8, 2, 64, t};  // D 64, group 4
    d64.max_context_bound = 40960;
    EXPECT_LT(run_case(d64, seed++), kTol) << name(t) << " D64";
  }
}

TEST(CudaPagedAttentionFp8, PrefillMatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 800;
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    for (int d : {64, 128}) {
      for (int group : {1, 4, 8}) {
        // Chunked prefill with prior context, mixed with decode rows (q_len 1).
        Case mixed{{5, 64, 1, 200, 130, 1}, {5, 164, 4000, 237, 1030, 17}, 2 * group, 2, d, t};
        EXPECT_LT(run_case(mixed, seed++), kTol)
            << name(t) << " mixed D=" << d << " group=" << group;
      }
      for (int len : {2, 63, 65, 600}) {
        Case single{{len}, {len}, 8, 2, d, t};
        EXPECT_LT(run_case(single, seed++), kTol) << name(t) << " D=" << d << " len=" << len;
      }
      Case tail{{40, 20}, {4096, 2100}, 8, 2, d, t};  // the last chunks of long prompts
      EXPECT_LT(run_case(tail, seed++), kTol) << name(t) << " ctx 4096 D=" << d;
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
