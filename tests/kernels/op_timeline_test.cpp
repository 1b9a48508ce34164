// The op timeline (SERVAL_OP_TIMELINE): marks between kernels on a stream give each op the GPU
// time since the op before it ended, on a real GPU.
#include "backend/cuda/op_timeline.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "kernels/cuda/misc/elementwise.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

TEST(CudaOpTimeline, ChargesEachOpItsOwnTime) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  setenv("SERVAL_OP_TIMELINE", "1", 1);
  backend::cuda::OpTimeline timeline;
  unsetenv("SERVAL_OP_TIMELINE");
  ASSERT_TRUE(timeline.enabled());
  // A large SiLU-and-mul (64 MB read, 32 MB written) and a small one.
  const int big_rows = 4096, small_rows = 1, inter = 4096;
  DeviceBuffer<bf16> x(random_bf16(size_t(big_rows) * 2 * inter, 5, -2.0f, 2.0f));
  DeviceBuffer<bf16> out(size_t(big_rows) * inter);
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  constexpr int kSteps = 5;
  for (int step = 0; step < kSteps; ++step) {
    timeline.restart(stream);
    kernels::cuda::silu_mul({x.get(), out.get(), big_rows, inter}, stream);
    timeline.mark("big", stream);
    kernels::cuda::silu_mul({x.get(), out.get(), small_rows, inter}, stream);
    timeline.mark("small", stream);
    timeline.collect(stream);
  }
  cuda_check(cudaStreamDestroy(stream), "stream");
  EXPECT_EQ(timeline.steps(), kSteps);
  const double big = timeline.us_per_step("start > big");
  const double small = timeline.us_per_step("big > small");
  EXPECT_GT(big, 10.0);  // ≥ 96 MB at ≤ 4.8 TB/s
  EXPECT_GT(small, 0.0);
  EXPECT_LT(small, big);
  EXPECT_LT(timeline.us_per_step("start > small"), 0.0);  // never adjacent
}

}  // namespace
}  // namespace serval::testing
