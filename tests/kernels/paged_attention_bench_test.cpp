// DISABLED_ benchmarks of paged attention at the Qwen3-30B-A3B shape (Hq 32, Hkv 4, D 128), bf16
// and fp8 KV caches.
// Run on the GPU with: kernels_gpu --gtest_also_run_disabled_tests --gtest_filter='*Bench*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "base/math.h"
#include "kernels/bench_timing.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda_test_util.h"
#include "kernels/fp8_test_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

constexpr int kHq = 32, kHkv = 4, kD = 128, kBs = 16;

struct Problem {
  std::vector<int32_t> query_start, ctx, tables;
  int num_blocks = 0, max_blocks = 0;
};

// num_seqs sequences of `ctx_len` context, q_len new tokens each, blocks shuffled.
Problem make_problem(int num_seqs, int q_len, int ctx_len) {
  Problem p;
  p.max_blocks = ceil_div(ctx_len, kBs);
  p.num_blocks = num_seqs * p.max_blocks;
  std::vector<int32_t> perm(p.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
  p.tables = perm;
  p.ctx.assign(num_seqs, ctx_len);
  p.query_start.resize(num_seqs + 1);
  for (int s = 0; s <= num_seqs; ++s) p.query_start[s] = s * q_len;
  return p;
}

// Random cache bytes of `dtype`: bf16 in [-1, 1), or fp8 codes with the top exponent bit clear
// (finite in both formats, magnitudes ≤ 2).
std::vector<uint8_t> random_cache(size_t elems, DType dtype, uint32_t seed) {
  if (!is_fp8(dtype)) {
    const auto b = random_bf16(elems, seed);
    std::vector<uint8_t> bytes(elems * 2);
    std::memcpy(bytes.data(), b.data(), bytes.size());
    return bytes;
  }
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(elems);
  for (auto& x : bytes) x = uint8_t(rng()) & 0xBF;
  return bytes;
}

// bound: the host bound max_context_len (0: ctx_len, as an eager step; CUDA graphs pass
// max_model_len). Prints eager µs per launch and, for decode, µs per launch inside a graph.
void bench(const char* name, int num_seqs, int q_len, int ctx_len, DType cache_dtype = DType::kBF16,
           int bound = 0) {
  if (bound == 0) bound = ctx_len;
  Problem pr = make_problem(num_seqs, q_len, ctx_len);
  const size_t cache_elems = size_t(pr.num_blocks) * kBs * kHkv * kD;
  const int T = num_seqs * q_len;
  DeviceBuffer<bf16> q(random_bf16(size_t(T) * kHq * kD, 1)), out(size_t(T) * kHq * kD);
  DeviceBuffer<uint8_t> k(random_cache(cache_elems, cache_dtype, 2)),
      v(random_cache(cache_elems, cache_dtype, 3));
  DeviceBuffer<int32_t> qs(pr.query_start), ctx(pr.ctx), tables(pr.tables);
  const size_t ws =
      kernels::cuda::paged_attention_workspace_bytes(num_seqs, kHq, kHkv, kD, q_len, bound);
  DeviceBuffer<unsigned char> work(ws);
  kernels::cuda::PagedAttentionParams p{};
  p.q = q.get();
  p.out = out.get();
  p.k_cache = k.get();
  p.v_cache = v.get();
  p.query_start = qs.get();
  p.context_lens = ctx.get();
  p.block_tables = tables.get();
  p.num_tokens = T;
  p.num_seqs = num_seqs;
  p.max_blocks_per_seq = pr.max_blocks;
  p.block_size = kBs;
  p.num_q_heads = kHq;
  p.num_kv_heads = kHkv;
  p.head_dim = kD;
  p.max_query_len = q_len;
  p.max_context_len = bound;
  p.scale = 1.0f / std::sqrt(float(kD));
  p.cache_dtype = cache_dtype;
  p.workspace = work.get();
  p.workspace_bytes = ws;
  const double us = median_us([&] { kernels::cuda::paged_attention(p, nullptr); }, 30);
  constexpr int kLaunches = 200;  // back to back in one graph
  const double graph = q_len == 1 ? graph_us(
                                        [&](cudaStream_t s) {
                                          for (int i = 0; i < kLaunches; ++i)
                                            kernels::cuda::paged_attention(p, s);
                                        },
                                        kLaunches)
                                  : 0.0;
  cuda_check(cudaDeviceSynchronize(), name);
  // KV bytes read once per (sequence, kv head); FLOPs: QKᵀ and PV, 2 each per MAC, causal keys.
  const double kv_bytes =
      double(num_seqs) * ctx_len * kHkv * kD * 2 * cache_elem_bytes(cache_dtype);
  const int prefix = ctx_len - q_len;
  double keys = 0;  // Σ over query rows of visible keys
  for (int i = 0; i < q_len; ++i) keys += prefix + i + 1;
  const double flops = 4.0 * num_seqs * kHq * kD * keys;
  if (q_len == 1) {
    std::printf(
        "%s (bound %d): eager %.1f us; in a graph %.2f us, KV read %.2f TB/s (%.0f%% of 4.3), "
        "splits %d\n",
        name, bound, us, graph, kv_bytes / graph * 1e-6, kv_bytes / graph * 1e-6 / 4.3 * 100,
        kernels::cuda::paged_attention_num_splits(num_seqs, kHq, kHkv, bound));
  } else {
    std::printf("%s: %.1f us, %.1f TFLOP/s\n", name, us, flops / us * 1e-6);
  }
}

TEST(CudaPagedAttentionBench, DISABLED_Qwen3Shape) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // Before the short-context rework (ncu, eager): batch 1 ctx 56 7.2 us, batch 8 ctx 1024
  // 24.4 us (0.69 TB/s), batch 64 ctx 4096 177.6 us (3.02 TB/s; must not get slower).
  bench("decode batch 64 ctx 4096", 64, 1, 4096);  // target ≥ 3.0 TB/s (70% of 4.3)
  bench("decode batch 64 ctx 4096", 64, 1, 4096, DType::kBF16, 40960);
  bench("decode batch 8 ctx 1024", 8, 1, 1024);
  bench("decode batch 8 ctx 1024", 8, 1, 1024, DType::kBF16, 40960);
  bench("decode batch 1 ctx 56", 1, 1, 56);  // target ≈ 3 us
  bench("decode batch 1 ctx 56", 1, 1, 56, DType::kBF16, 40960);
  bench("decode batch 1 ctx 512", 1, 1, 512);
  bench("decode batch 1 ctx 512", 1, 1, 512, DType::kBF16, 40960);
  bench("decode batch 1 ctx 4096", 1, 1, 4096);
  bench("decode batch 1 ctx 4096", 1, 1, 4096, DType::kBF16, 40960);
  bench("prefill 8192 tokens", 1, 8192, 8192);  // target ≥ 395 TFLOP/s (50% of 790)
  bench("prefill 8 x 1024 tokens", 8, 1024, 1024);
}

// KV bytes halve with fp8: the decode target stays ≥ 3.0 TB/s (70% of 4.3) on those bytes.
TEST(CudaPagedAttentionBench, DISABLED_Qwen3ShapeFp8) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    const char* fmt = t == DType::kF8E4M3 ? "e4m3" : "e5m2";
    std::printf("-- %s KV cache\n", fmt);
    bench("decode batch 64 ctx 4096", 64, 1, 4096, t);  // target ≥ 3.0 TB/s
    bench("decode batch 8 ctx 1024", 8, 1, 1024, t);
    bench("decode batch 1 ctx 56", 1, 1, 56, t, 40960);
    bench("decode batch 1 ctx 512", 1, 1, 512, t, 40960);
    bench("decode batch 1 ctx 4096", 1, 1, 4096, t);
    bench("prefill 8192 tokens", 1, 8192, 8192, t);
  }
}

}  // namespace
}  // namespace serval::testing
