// DISABLED_ benchmark of the prefill attention path (paged_attention_prefill: the wgmma kernel at
// this head_dim) at the Qwen3-30B-A3B shape (Hq 32, Hkv 4, D 128): full prompts, several prompts,
// and chunked prefill over a prefix, on bf16 and fp8 e4m3 caches. Figures are causal FLOPs / time
// against the 761 TFLOP/s bf16 rate. Run on the GPU with:
//   kernels_gpu --gtest_also_run_disabled_tests --gtest_filter='CudaPagedPrefillBench.*'
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

constexpr int kHq = 32, kHkv = 4, kD = 128, kBs = 16;
constexpr double kPeakTflops = 761.0;  // dense bf16 matrix product measured on the H200

// num_seqs sequences of q_len new tokens at context ctx_len (prefix ctx_len − q_len) each;
// returns the median µs of 20 launches after warm-up.
double run(const char* name, int num_seqs, int q_len, int ctx_len, DType dtype) {
  const PagedLayout layout = make_dense_paged_layout(num_seqs, q_len, ctx_len, kBs);
  const size_t cache_bytes = size_t(layout.num_blocks) * kBs * kHkv * kD * cache_elem_bytes(dtype);
  std::vector<uint8_t> kv_host(cache_bytes);
  std::mt19937 rng(2);
  // Random bytes with the top exponent bit clear: finite bf16 / fp8 values of magnitude ≤ 2.
  for (size_t i = 0; i < cache_bytes; ++i)
    kv_host[i] = uint8_t(rng()) & ((is_fp8(dtype) || i % 2 == 1) ? 0xBF : 0xFF);
  // K and V hold the same bytes; bound 0: ctx_len, as an eager step.
  PagedDeviceProblem dev(make_bench_problem(layout, kHq, kHkv, kD, dtype, kv_host, kv_host), 0);
  const kernels::cuda::PagedAttentionParams& p = dev.params;

  const double med = median_us([&] { kernels::cuda::paged_attention(p, nullptr); });
  cuda_check(cudaDeviceSynchronize(), name);
  const double tflops = causal_attention_flops(num_seqs, q_len, ctx_len, kHq, kD) / med * 1e-6;
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
