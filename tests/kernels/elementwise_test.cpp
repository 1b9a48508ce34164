// CUDA silu_mul, sigmoid_gate_add, embedding and gather_rows against CPU references.
#include "kernels/cuda/misc/elementwise.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

constexpr double kTol = 1e-2;  // bf16 output rounding ≈ 2e-3 rel L2

TEST(CudaSiluMul, MatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // inter 768 takes the 16-byte path, 100 and 13 the scalar one.
  for (int inter : {768, 100, 13}) {
    for (int rows : {1, 5, 64}) {
      SCOPED_TRACE(::testing::Message() << "rows=" << rows << " inter=" << inter);
      auto x = random_bf16(size_t(rows) * 2 * inter, uint32_t(rows * 7 + inter), -4.0f, 4.0f);
      std::vector<float> x_f = to_float(x), want(size_t(rows) * inter);
      kernels::cpu::silu_mul({x_f.data(), want.data(), rows, inter});
      DeviceBuffer<bf16> d_x(x), d_out(want.size());
      d_out.poison();
      kernels::cuda::silu_mul({d_x.get(), d_out.get(), rows, inter}, nullptr);
      EXPECT_LT(rel_l2(d_out.download(), want), kTol);
    }
  }
}

// The gate/up tiled layout (tile 16): gate of column i at 32·(i / 16) + i % 16, up 16 further.
// x + 8 elements (16 bytes) is misaligned for the 16-byte path: the scalar path's tiling too.
TEST(CudaSiluMul, TiledLayoutMatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (int offset : {0, 1}) {
    const int rows = 5, inter = 96;
    SCOPED_TRACE(::testing::Message() << "offset " << offset);
    auto x = random_bf16(size_t(rows) * 2 * inter + 1, 77, -4.0f, 4.0f);
    const std::vector<float> x_f = to_float(x);
    std::vector<float> halves(size_t(rows) * 2 * inter), want(size_t(rows) * inter);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 2 * inter; ++c) {
        const int src = 32 * ((c % inter) / 16) + (c % inter) % 16 + (c < inter ? 0 : 16);
        halves[size_t(r) * 2 * inter + c] = x_f[size_t(offset) + size_t(r) * 2 * inter + src];
      }
    kernels::cpu::silu_mul({halves.data(), want.data(), rows, inter});
    DeviceBuffer<bf16> d_x(x), d_out(want.size());
    d_out.poison();
    kernels::cuda::silu_mul({d_x.get() + offset, d_out.get(), rows, inter, 16}, nullptr);
    EXPECT_LT(rel_l2(d_out.download(), want), kTol);
  }
  EXPECT_THROW(kernels::cuda::silu_mul({nullptr, nullptr, 1, 24, 16}, nullptr), InvalidArgument);
}

// out += sigmoid(gate) · x per row: the 16-byte path (cols 2048) and the scalar one (cols 20,
// and 2048 with x one element off alignment).
TEST(CudaSigmoidGateAdd, MatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (const auto& [cols, offset] :
       std::vector<std::pair<int, int>>{{2048, 0}, {20, 0}, {2048, 1}}) {
    for (int rows : {1, 7, 64}) {
      SCOPED_TRACE(::testing::Message()
                   << "rows=" << rows << " cols=" << cols << " offset=" << offset);
      const size_t n = size_t(rows) * cols;
      auto gate = random_bf16(size_t(rows), uint32_t(rows + cols), -6.0f, 6.0f);
      auto x = random_bf16(n + offset, uint32_t(rows * 3 + cols), -2.0f, 2.0f);
      auto out = random_bf16(n, uint32_t(rows * 5 + cols), -2.0f, 2.0f);
      const std::vector<float> gate_f = to_float(gate), x_f = to_float(x);
      std::vector<float> want = to_float(out);
      kernels::cpu::sigmoid_gate_add({gate_f.data(), x_f.data() + offset, want.data(), rows, cols});
      DeviceBuffer<bf16> d_gate(gate), d_x(x), d_out(out);
      kernels::cuda::sigmoid_gate_add({d_gate.get(), d_x.get() + offset, d_out.get(), rows, cols},
                                      nullptr);
      EXPECT_LT(rel_l2(d_out.download(), want), kTol);
    }
  }
}

// bf16 → fp32 is exact: every value comes back bit for bit.
TEST(CudaBf16ToFloat, IsExact) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (int64_t n : {1, 1000, 70001}) {
    const auto x = random_bf16(size_t(n), uint32_t(n), -100.0f, 100.0f);
    DeviceBuffer<bf16> d_x(x);
    DeviceBuffer<float> d_out(static_cast<size_t>(n));
    d_out.poison();
    kernels::cuda::bf16_to_float({d_x.get(), d_out.get(), n}, nullptr);
    EXPECT_EQ(d_out.download(), to_float(x)) << n;
  }
}

TEST(CudaEmbedding, CopiesTableRowsExactly) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (int hidden : {2048, 20}) {  // vector and scalar paths
    const int vocab = 1000, tokens = 37;
    auto table = random_bf16(size_t(vocab) * hidden, uint32_t(hidden));
    std::vector<int32_t> ids(tokens);
    std::mt19937 rng(5);
    for (auto& id : ids) id = int32_t(rng() % vocab);
    ids[0] = 0;
    ids[1] = vocab - 1;
    std::vector<float> want(size_t(tokens) * hidden);
    kernels::cpu::embedding(
        {table.data(), DType::kBF16, ids.data(), want.data(), tokens, hidden, vocab});
    DeviceBuffer<bf16> d_table(table), d_out(want.size());
    DeviceBuffer<int32_t> d_ids(ids);
    d_out.poison();
    kernels::cuda::embedding({d_table.get(), d_ids.get(), d_out.get(), tokens, hidden}, nullptr);
    EXPECT_EQ(rel_l2(d_out.download(), want), 0.0) << "hidden=" << hidden;  // a copy: exact
  }
}

TEST(CudaGatherRows, PicksRequestedRows) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const int src_rows = 50, cols = 4096;
  auto src = random_bf16(size_t(src_rows) * cols, 11);
  std::vector<int32_t> rows = {49, 0, 7, 7, 23};
  DeviceBuffer<bf16> d_src(src), d_out(rows.size() * cols);
  DeviceBuffer<int32_t> d_rows(rows);
  d_out.poison();
  kernels::cuda::gather_rows({d_src.get(), d_rows.get(), d_out.get(), int(rows.size()), cols},
                             nullptr);
  auto got = d_out.download();
  for (size_t i = 0; i < rows.size(); ++i)
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(got[i * cols + c].bits, src[size_t(rows[i]) * cols + c].bits) << i << "," << c;
}

}  // namespace
}  // namespace serval::testing
