// The op timeline (SERVAL_OP_TIMELINE): marks between kernels on a stream give each op the GPU
// time since the op before it ended, on a real GPU.
#include "backend/cuda/op_timeline.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "kernels/cuda/misc/elementwise.h"
#include "kernels/cuda/misc/timeline_probe.h"
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
  const auto run_ops = [&] {
    kernels::cuda::silu_mul({x.get(), out.get(), big_rows, inter}, stream);
    timeline.mark("big", stream);
    // An op of two kernels with a sub-op mark between them (the sink restart() installed).
    kernels::cuda::silu_mul({x.get(), out.get(), small_rows, inter}, stream);
    kernels::cuda::timeline_mark("first half", stream);
    kernels::cuda::silu_mul({x.get(), out.get(), small_rows, inter}, stream);
    timeline.mark("small", stream);
  };
  using Steps = backend::cuda::OpTimeline::Steps;
  constexpr int kEagerSteps = 5, kGraphSteps = 3;
  for (int step = 0; step < kEagerSteps; ++step) {
    timeline.restart(stream);
    run_ops();
    timeline.collect(stream);
  }
  // The same ops captured once (with their marks) and replayed: added up as graph steps.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  timeline.restart(stream);
  run_ops();
  const std::vector<const char*> marks = timeline.take_marks();
  cuda_check(cudaStreamEndCapture(stream, &graph), "capture");
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int step = 0; step < kGraphSteps; ++step) {
    timeline.restart(stream);
    cuda_check(cudaGraphLaunch(exec, stream), "replay");
    timeline.adopt(marks);
    timeline.collect(stream);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cuda_check(cudaStreamDestroy(stream), "stream");
  for (const Steps kind : {Steps::kEager, Steps::kGraph}) {
    EXPECT_EQ(timeline.steps(kind), kind == Steps::kEager ? kEagerSteps : kGraphSteps);
    const double big = timeline.us_per_step(kind, "start > big");
    const double first = timeline.us_per_step(kind, "big > first half");
    const double second = timeline.us_per_step(kind, "first half > small");
    EXPECT_GT(big, 10.0);  // ≥ 96 MB at ≤ 4.8 TB/s
    EXPECT_GT(first, 0.0);
    EXPECT_GT(second, 0.0);
    EXPECT_LT(first + second, big);
    EXPECT_LT(timeline.us_per_step(kind, "big > small"), 0.0);    // the sub-op mark is between
    EXPECT_LT(timeline.us_per_step(kind, "start > small"), 0.0);  // never adjacent
  }
}

}  // namespace
}  // namespace serval::testing
