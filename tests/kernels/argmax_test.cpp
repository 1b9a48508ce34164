// CUDA argmax (split over CTAs for up to 1024 rows, one CTA per row above) and the previous
// one-CTA kernel (argmax_single_cta) vs a CPU oracle of the header's contract, exactly: the lowest
// index of the largest non-NaN value ≥ −FLT_MAX (−inf is never chosen, −0 equals +0), 0 when
// there is none.
#include "kernels/cuda/sampling/argmax.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_test_util.h"

namespace serval::kernels::cuda {
namespace {

using serval::testing::moe_util::cuda_ok;
using serval::testing::moe_util::DeviceBuffer;
using serval::testing::moe_util::Rng;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<int32_t> oracle(const std::vector<float>& logits, int rows, int vocab) {
  std::vector<int32_t> out(rows, 0);
  for (int r = 0; r < rows; ++r) {
    const float* row = logits.data() + size_t(r) * vocab;
    int best = -1;
    for (int v = 0; v < vocab; ++v) {
      const float x = row[v];
      if (std::isnan(x) || x == -kInf) continue;
      if (best < 0 || x > row[best]) best = v;  // strict: the first of equal values stays
    }
    out[r] = best < 0 ? 0 : best;
  }
  return out;
}

std::vector<float> random_logits(int rows, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(size_t(rows) * vocab);
  for (auto& x : v) x = 4.0f * rng.normal();
  return v;
}

using Launch = void (*)(const ArgmaxParams&, cudaStream_t);

// Runs `launch` on `logits` placed `offset` floats into the device buffer (offset 1 makes every
// row start misaligned for 16-byte loads) and compares with the oracle.
void check(const std::vector<float>& logits, int rows, int vocab, Launch launch, int offset = 0) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << ", vocab " << vocab << ", offset "
                                    << offset << (launch == argmax ? "" : ", single-CTA kernel"));
  DeviceBuffer d_logits((logits.size() + offset) * 4), d_out(size_t(rows) * 4);
  cuda_ok(cudaMemcpy(d_logits.as<float>() + offset, logits.data(), logits.size() * 4,
                     cudaMemcpyHostToDevice),
          "upload");
  d_out.poison();
  launch({d_logits.as<float>() + offset, d_out.as<int32_t>(), rows, vocab}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = d_out.download<int32_t>(rows);
  const auto want = oracle(logits, rows, vocab);
  for (int r = 0; r < rows; ++r) ASSERT_EQ(got[r], want[r]) << "row " << r;
}

void check_both(const std::vector<float>& logits, int rows, int vocab, int offset = 0) {
  check(logits, rows, vocab, argmax, offset);
  check(logits, rows, vocab, argmax_single_cta, offset);
}

class ArgmaxGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  }
};

TEST_F(ArgmaxGpu, RandomRows) {
  // 151936: Qwen3 vocab (16-byte loads, 38 CTAs a row); 4097, 999: scalar loads; 1, 3: tiny.
  for (int vocab : {151936, 1000, 4097, 999, 4096, 8192 + 4, 1, 3})
    for (int rows : {1, 2, 8, 33})
      check_both(random_logits(rows, vocab, vocab + rows), rows, vocab);
  check_both(random_logits(3, 1000, 5), 3, 1000, 1);  // misaligned rows: scalar loads
  check_both(random_logits(2, 151936, 6), 2, 151936, 1);
}

TEST_F(ArgmaxGpu, ManyRowsOneCtaEach) {
  for (int vocab : {1000, 999, 4097}) check_both(random_logits(1100, vocab, vocab), 1100, vocab);
  check_both(random_logits(1024, 4097, 7), 1024, 4097);  // the most rows that still split
}

TEST_F(ArgmaxGpu, TiesGoToTheLowestIndex) {
  for (int vocab : {151936, 4097, 1000}) {
    const int rows = 4;
    auto logits = random_logits(rows, vocab, 11 + vocab);
    // Row 0: the max at indices in different CTAs, written high to low.
    for (int v : {vocab - 1, vocab / 2 + 3, 4096 % vocab, 5}) logits[v] = 100.0f;
    // Row 1: every element equal → index 0.
    for (int v = 0; v < vocab; ++v) logits[size_t(1) * vocab + v] = 1.5f;
    // Row 2: maxima in the last slice only.
    for (int v : {vocab - 1, vocab - 2}) logits[size_t(2) * vocab + v] = 100.0f;
    // Row 3: all negative except −0 (lower index) and +0 (higher index), which are equal.
    float* row3 = logits.data() + size_t(3) * vocab;
    for (int v = 0; v < vocab; ++v) row3[v] = -1.0f - std::fabs(row3[v]);
    row3[vocab - 1] = 0.0f;
    row3[vocab / 3] = -0.0f;
    check_both(logits, rows, vocab);
    EXPECT_EQ(oracle(logits, rows, vocab)[3], vocab / 3);  // the oracle treats −0 == +0
  }
}

TEST_F(ArgmaxGpu, NaNAndInfinities) {
  for (int vocab : {151936, 4097}) {
    const int rows = 7;
    auto logits = random_logits(rows, vocab, 21 + vocab);
    auto row = [&](int r) { return logits.data() + size_t(r) * vocab; };
    // Row 0: NaNs (at index 0 and across slices) are skipped; the max is elsewhere.
    for (int v : {0, 7, vocab / 2, vocab - 1}) row(0)[v] = kNaN;
    // Row 1: all NaN → 0.
    for (int v = 0; v < vocab; ++v) row(1)[v] = kNaN;
    // Row 2: all −inf → 0.
    for (int v = 0; v < vocab; ++v) row(2)[v] = -kInf;
    // Row 3: +inf twice → the first.
    row(3)[vocab - 3] = kInf;
    row(3)[vocab / 2 + 1] = kInf;
    // Row 4: −inf and NaN except −FLT_MAX at two places → the first of those.
    for (int v = 0; v < vocab; ++v) row(4)[v] = v % 2 ? -kInf : kNaN;
    row(4)[vocab - 2] = -FLT_MAX;
    row(4)[vocab / 3] = -FLT_MAX;
    // Row 5: a negative NaN bit pattern (0xFFFFFFFF) and NaN before the max.
    uint32_t all_ones = 0xffffffffu;
    std::memcpy(&row(5)[1], &all_ones, 4);
    row(5)[2] = kNaN;
    row(5)[3] = 1000.0f;
    // Row 6: one finite value among NaNs at the very end.
    for (int v = 0; v < vocab; ++v) row(6)[v] = kNaN;
    row(6)[vocab - 1] = -3.0f;
    check_both(logits, rows, vocab);
  }
}

// Launches back to back without host synchronisation, eager and in a replayed CUDA graph: the
// per-row slots and arrival counters must be reset by each launch for the next.
TEST_F(ArgmaxGpu, BackToBackLaunchesAndGraphReplay) {
  const int vocab = 151936, rows = 8, calls = 4;
  std::vector<std::vector<float>> inputs;
  std::vector<std::unique_ptr<DeviceBuffer>> d_in, d_out;
  for (int i = 0; i < calls; ++i) {
    inputs.push_back(random_logits(rows, vocab, 100 + i));
    d_in.push_back(std::make_unique<DeviceBuffer>(size_t(rows) * vocab * 4));
    d_in.back()->upload(inputs.back());
    d_out.push_back(std::make_unique<DeviceBuffer>(size_t(rows) * 4));
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto enqueue = [&](cudaStream_t s) {
    for (int i = 0; i < calls; ++i)
      argmax({d_in[i]->as<float>(), d_out[i]->as<int32_t>(), i % 2 ? rows : 1, vocab}, s);
  };
  auto verify = [&](const char* how) {
    for (int i = 0; i < calls; ++i) {
      const int n = i % 2 ? rows : 1;
      EXPECT_EQ(d_out[i]->download<int32_t>(n), oracle(inputs[i], n, vocab))
          << how << ", call " << i;
    }
  };
  for (int rep = 0; rep < 2; ++rep) {
    for (auto& o : d_out) o->poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // poison done before `stream` runs
    enqueue(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    verify("eager");
  }
  const serval::testing::CapturedGraph graph(stream, enqueue);
  for (int rep = 0; rep < 3; ++rep) {
    for (auto& o : d_out) o->poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    graph.launch(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    verify("graph");
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace serval::kernels::cuda
