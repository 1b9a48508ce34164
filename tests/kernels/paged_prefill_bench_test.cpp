// DISABLED_ benchmark of the prefill attention path (paged_prefill.cu) at the Qwen3-30B-A3B shape
// (Hq 32, Hkv 4, D 128): full prompts, several prompts, and chunked prefill over a prefix, on
// bf16 and fp8 e4m3 caches. Figures are causal FLOPs / time against the 761 TFLOP/s bf16 rate.
// Run on the GPU with: kernels_gpu --gtest_also_run_disabled_tests
//   --gtest_filter='CudaPagedPrefillBench.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
constexpr double kPeakTflops = 761.0;  // dense bf16 matrix product measured on the H200

// num_seqs sequences of q_len new tokens at context ctx_len (prefix ctx_len − q_len) each;
// returns the median µs of 20 launches after warm-up.
double run(const char* name, int num_seqs, int q_len, int ctx_len, DType dtype) {
  const int max_blocks = ceil_div(ctx_len, kBs), num_blocks = num_seqs * max_blocks;
  std::vector<int32_t> tables(num_blocks), ctx(num_seqs, ctx_len), qs(num_seqs + 1);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(1));
  for (int s = 0; s <= num_seqs; ++s) qs[s] = s * q_len;
  const int T = num_seqs * q_len;
  const size_t cache_bytes = size_t(num_blocks) * kBs * kHkv * kD * cache_elem_bytes(dtype);
  std::vector<uint8_t> kv_host(cache_bytes);
  std::mt19937 rng(2);
  // Random bytes with the top exponent bit clear: finite bf16 / fp8 values of magnitude ≤ 2.
  for (size_t i = 0; i < cache_bytes; ++i)
    kv_host[i] = uint8_t(rng()) & ((is_fp8(dtype) || i % 2 == 1) ? 0xBF : 0xFF);
  DeviceBuffer<bf16> q(random_bf16(size_t(T) * kHq * kD, 1)), out(size_t(T) * kHq * kD);
  DeviceBuffer<uint8_t> k(kv_host), v(kv_host);
  DeviceBuffer<int32_t> d_qs(qs), d_ctx(ctx), d_tables(tables);
  kernels::cuda::PagedAttentionParams p{};
  p.q = q.get();
  p.out = out.get();
  p.k_cache = k.get();
  p.v_cache = v.get();
  p.query_start = d_qs.get();
  p.context_lens = d_ctx.get();
  p.block_tables = d_tables.get();
  p.num_tokens = T;
  p.num_seqs = num_seqs;
  p.max_blocks_per_seq = max_blocks;
  p.block_size = kBs;
  p.num_q_heads = kHq;
  p.num_kv_heads = kHkv;
  p.head_dim = kD;
  p.max_query_len = q_len;
  p.max_context_len = ctx_len;
  p.scale = 1.0f / std::sqrt(float(kD));
  p.cache_dtype = dtype;

  const double med = median_us([&] { kernels::cuda::paged_attention(p, nullptr); });
  cuda_check(cudaDeviceSynchronize(), name);
  // QKᵀ and PV: 2 FLOPs per MAC each, over the causally visible keys of every query row.
  double keys = 0;
  for (int i = 0; i < q_len; ++i) keys += ctx_len - q_len + i + 1;
  const double tflops = 4.0 * num_seqs * kHq * kD * keys / med * 1e-6;
  std::printf("%-34s %-5s %9.1f us  %6.1f TFLOP/s  (%4.1f%% of %.0f)\n", name,
              is_fp8(dtype) ? "e4m3" : "bf16", med, tflops, 100.0 * tflops / kPeakTflops,
              kPeakTflops);
  return med;
}

TEST(CudaPagedPrefillBench, DISABLED_Qwen3Shape) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (DType t : {DType::kBF16, DType::kF8E4M3}) {
    run("prefill 8192 tokens", 1, 8192, 8192, t);  // target ≥ 380 TFLOP/s (50%)
    run("prefill 8 x 1024 tokens", 8, 1024, 1024, t);
    run("prefill 2 x 4096 tokens", 2, 4096, 4096, t);
    run("chunk 2048 at context 8192", 1, 2048, 8192, t);
    run("4 chunks of 512 at context 4096", 4, 512, 4096, t);
  }
}

}  // namespace
}  // namespace serval::testing
