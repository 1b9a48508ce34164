// The rules of CublasLtGemm's first-use tuning (backend/cuda/gemm_tuning.h).
#include "backend/cuda/gemm_tuning.h"

#include <gtest/gtest.h>

namespace serval::backend::cuda {
namespace {

TEST(GemmTuning, BucketIsTheNextPowerOfTwo) {
  EXPECT_EQ(gemm_tune_bucket(1), 1);
  EXPECT_EQ(gemm_tune_bucket(2), 2);
  EXPECT_EQ(gemm_tune_bucket(3), 4);
  EXPECT_EQ(gemm_tune_bucket(1024), 1024);
  EXPECT_EQ(gemm_tune_bucket(1025), 2048);
  EXPECT_EQ(gemm_tune_bucket(8192), 8192);
}

TEST(GemmTuning, OnlyLargeGemmsAreTimed) {
  // Llama-70B gate_up (n 57344, k 8192): decode batches stay on the heuristic, prefill is timed.
  EXPECT_FALSE(gemm_worth_tuning(8, 57344, 8192));   // 7.5 GFLOP
  EXPECT_TRUE(gemm_worth_tuning(128, 57344, 8192));  // 120 GFLOP
  // Qwen3-30B qkv (n 5120, k 2048) at 8192 tokens: 172 GFLOP.
  EXPECT_TRUE(gemm_worth_tuning(8192, 5120, 2048));
  EXPECT_FALSE(gemm_worth_tuning(64, 5120, 2048));
  EXPECT_FALSE(gemm_worth_tuning(0, 5120, 2048));
}

TEST(GemmTuning, FastestByMedianTiesKeepTheHeuristicOrder) {
  EXPECT_FLOAT_EQ(gemm_tune_median({3.0f, 1.0f, 2.0f}), 2.0f);
  EXPECT_FLOAT_EQ(gemm_tune_median({5.0f}), 5.0f);
  EXPECT_EQ(gemm_fastest({1.2f, 1.0f, 1.1f}), 1);
  EXPECT_EQ(gemm_fastest({1.0f, 1.0f}), 0);
  EXPECT_EQ(gemm_fastest({-1.0f, 2.0f, -1.0f}), 1);  // failed candidates are skipped
  EXPECT_EQ(gemm_fastest({-1.0f, -1.0f}), -1);
  EXPECT_EQ(gemm_fastest({}), -1);
}

TEST(GemmTuning, RunsThatMayLoadKernelsAreNewOrStillToBeTimed) {
  EXPECT_TRUE(gemm_run_may_load(/*planned=*/false, /*still_to_time=*/false));
  // Planned during a graph capture (nothing timed there): its first eager run times candidates,
  // whose kernels cuBLASLt may load then (a tensor-parallel rank needs its first-use fence).
  EXPECT_TRUE(gemm_run_may_load(true, true));
  EXPECT_FALSE(gemm_run_may_load(true, false));
}

}  // namespace
}  // namespace serval::backend::cuda
