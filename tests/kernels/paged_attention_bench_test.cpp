// DISABLED_ benchmarks of paged attention at the Qwen3-30B-A3B shape (Hq 32, Hkv 4, D 128) and
// the Llama-3.3-70B one (Hq 64, Hkv 8), bf16 and fp8 KV caches.
// Run on the GPU with: kernels_gpu --gtest_also_run_disabled_tests --gtest_filter='*Bench*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "kernels/bench_timing.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda_test_util.h"
#include "kernels/fp8_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/paged_case_util.h"

namespace serval::testing {
namespace {

constexpr int kD = 128, kBs = 16;

struct Heads {
  int q, kv;
};
constexpr Heads kQwen3Heads{32, 4}, kLlamaHeads{64, 8};

// Random cache bytes of `dtype`: bf16 in [-1, 1), or fp8 codes with the top exponent bit clear
// (finite in both formats, magnitudes ≤ 2).
std::vector<uint8_t> random_cache(size_t elems, DType dtype, uint32_t seed) {
  if (!is_fp8(dtype)) return bf16_bytes(random_bf16(elems, seed));
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(elems);
  for (auto& x : bytes) x = uint8_t(rng()) & 0xBF;
  return bytes;
}

// bound: the host bound max_context_len (0: ctx_len, as an eager step; CUDA graphs pass
// max_model_len). Prints eager µs per launch and, for decode, µs per launch inside a graph.
void bench(const char* name, int num_seqs, int q_len, int ctx_len, DType cache_dtype = DType::kBF16,
           int bound = 0, Heads heads = kQwen3Heads) {
  if (bound == 0) bound = ctx_len;
  // num_seqs sequences of ctx_len context, q_len new tokens each, blocks shuffled.
  const PagedLayout layout = make_dense_paged_layout(num_seqs, q_len, ctx_len, kBs);
  const size_t cache_elems = size_t(layout.num_blocks) * kBs * heads.kv * kD;
  PagedDeviceProblem dev(make_bench_problem(layout, heads.q, heads.kv, kD, cache_dtype,
                                            random_cache(cache_elems, cache_dtype, 2),
                                            random_cache(cache_elems, cache_dtype, 3)),
                         bound);
  const kernels::cuda::PagedAttentionParams& p = dev.params;
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
      double(num_seqs) * ctx_len * heads.kv * kD * 2 * cache_elem_bytes(cache_dtype);
  const double flops = causal_attention_flops(num_seqs, q_len, ctx_len, heads.q, kD);
  if (q_len == 1) {
    std::printf(
        "%s (bound %d): eager %.1f us; in a graph %.2f us, KV read %.2f TB/s (%.0f%% of 4.3), "
        "splits %d\n",
        name, bound, us, graph, kv_bytes / graph * 1e-6, kv_bytes / graph * 1e-6 / 4.3 * 100,
        kernels::cuda::paged_attention_num_splits(num_seqs, heads.q, heads.kv, bound));
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
  bench("decode batch 64 ctx 1024", 64, 1, 1024);  // batched serving steps
  bench("decode batch 64 ctx 1024", 64, 1, 1024, DType::kBF16, 40960);
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
    bench("decode batch 64 ctx 1024", 64, 1, 1024, t);
    bench("decode batch 64 ctx 1024", 64, 1, 1024, t, 40960);
    bench("decode batch 1 ctx 56", 1, 1, 56, t, 40960);
    bench("decode batch 1 ctx 512", 1, 1, 512, t, 40960);
    bench("decode batch 1 ctx 4096", 1, 1, 4096, t);
    bench("prefill 8192 tokens", 1, 8192, 8192, t);
  }
}

// Long contexts at small batch (the many-split regime, where each CTA's tile loop and the merge
// of up to 64 partials set the time): graph-timed like a decode step under a 40960-token bound.
TEST(CudaPagedAttentionBench, DISABLED_LongContext) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (DType t : {DType::kBF16, DType::kF8E4M3}) {
    std::printf("-- %s KV cache\n", t == DType::kBF16 ? "bf16" : "e4m3");
    bench("decode batch 1 ctx 8192", 1, 1, 8192, t, 40960);
    bench("decode batch 1 ctx 16384", 1, 1, 16384, t, 40960);
    bench("decode batch 1 ctx 32000", 1, 1, 32000, t, 40960);
    bench("decode batch 4 ctx 32000", 4, 1, 32000, t, 40960);
  }
}

// The Llama-3.3-70B decode steps of `serval bench latency` (fp8 KV, 128 or 1024 prompt tokens
// plus up to 32 generated), under the exact bound and the bounds a CUDA graph may carry.
TEST(CudaPagedAttentionBench, DISABLED_LlamaShapeFp8) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (int bound : {0, 2048, 131072}) {
    bench("llama decode batch 1 ctx 144", 1, 1, 144, DType::kF8E4M3, bound, kLlamaHeads);
    bench("llama decode batch 8 ctx 1040", 8, 1, 1040, DType::kF8E4M3, bound, kLlamaHeads);
  }
}

}  // namespace
}  // namespace serval::testing
