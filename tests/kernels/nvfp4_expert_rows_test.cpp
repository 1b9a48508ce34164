// The W4A4 row quantizer of the MoE expert GEMMs against its CPU twin: every token row of a
// hand-built routing map (tiles of 4 experts with their own global scales, padding rows, a
// worst-case grid past the real tiles) equals kernels::cpu::nvfp4_fake_quant_rows of its source
// row with its expert's scale, rounded to bf16, bit for bit; rows without a token and rows past
// the tiles keep their poison; gathering writes GEMM1's row map. Random bf16 data with outliers,
// an all-zero block, inf and NaN elements.
#include "kernels/cuda/quant/nvfp4_expert_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/nvfp4_quant.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

constexpr int kTile = 8, kMaxTiles = 7, kMaxRows = kTile * kMaxTiles, kTokens = 13;
const std::vector<int32_t> kTileExpert = {2, 0, 0, 3, 1, 0, 0};  // the last two past num_tiles
constexpr int kNumTiles = 5;
const std::vector<float> kScaleFactor = {1.0f, 0.37f, 2.5f, 11.0f};  // per expert, × 2688/amax

// Token rows: tile t holds 8 − (t % 3) tokens (a prefix), the rest is padding (−1).
std::vector<int32_t> permuted_to_token() {
  std::vector<int32_t> p2t(kMaxRows, -1);
  for (int t = 0; t < kNumTiles; ++t)
    for (int i = 0; i < kTile - t % 3; ++i) p2t[t * kTile + i] = (t * 5 + i * 3) % kTokens;
  return p2t;
}

std::vector<bf16> rows_with_specials(int rows, int n, uint32_t seed) {
  std::vector<bf16> x = random_bf16(size_t(rows) * n, seed, -4.0f, 4.0f);
  for (size_t i = 0; i < x.size(); i += 97) x[i] = float_to_bf16(bf16_to_float(x[i]) * 40.0f);
  for (int i = 0; i < 16; ++i) x[size_t(n) + i] = float_to_bf16(0.0f);  // row 1: a zero block
  x[size_t(2) * n + 3] = float_to_bf16(std::numeric_limits<float>::infinity());
  x[size_t(3) * n + 5] = float_to_bf16(-std::numeric_limits<float>::quiet_NaN());
  return x;
}

std::vector<float> global_scales(const std::vector<bf16>& x) {
  float amax = 0.0f;
  for (bf16 v : x)
    if (std::isfinite(bf16_to_float(v))) amax = std::max(amax, std::fabs(bf16_to_float(v)));
  std::vector<float> g;
  for (float f : kScaleFactor) g.push_back(448.0f * 6.0f / amax * f);
  return g;
}

// The CPU twin of one row, rounded to bf16 as the GPU stores it.
std::vector<uint16_t> cpu_row(const bf16* row, int n, float g) {
  std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) in[size_t(i)] = bf16_to_float(row[i]);
  kernels::cpu::nvfp4_fake_quant_rows(in.data(), 1, n, g, out.data());
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) bits[size_t(i)] = float_to_bf16(out[size_t(i)]).bits;
  return bits;
}

// Checks dst against the twin (token rows) or the poison (every other row).
void expect_rows(const std::vector<bf16>& got, const std::vector<bf16>& src, bool gather,
                 const std::vector<int32_t>& p2t, const std::vector<float>& g, int n) {
  int mismatches = 0;
  for (int r = 0; r < kMaxRows; ++r) {
    const bool token_row = r < kNumTiles * kTile && p2t[size_t(r)] >= 0;
    std::vector<uint16_t> want(static_cast<size_t>(n), 0xFFFFu);  // the poison
    if (token_row) {
      const size_t src_row = gather ? size_t(p2t[size_t(r)]) : size_t(r);
      want = cpu_row(&src[src_row * n], n, g[size_t(kTileExpert[size_t(r / kTile)])]);
    } else if (!gather) {
      for (int i = 0; i < n; ++i) want[size_t(i)] = src[size_t(r) * n + i].bits;  // in place
    }
    for (int i = 0; i < n; ++i) {
      const uint16_t bits = got[size_t(r) * n + i].bits;
      if (bits != want[size_t(i)] && ++mismatches <= 5)
        ADD_FAILURE() << (gather ? "gather" : "in place") << " n " << n << " row " << r << " ("
                      << (token_row ? "token" : "no token") << ") element " << i << ": gpu 0x"
                      << std::hex << bits << " want 0x" << want[size_t(i)] << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0) << (gather ? "gather" : "in place") << " n " << n;
}

TEST(CudaNvfp4ExpertRows, EqualsCpuFakeQuantPerExpert) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::vector<int32_t> p2t = permuted_to_token();
  DeviceBuffer<int32_t> d_p2t(p2t), d_tile_expert(kTileExpert);
  DeviceBuffer<int32_t> d_num_tiles(std::vector<int32_t>{kNumTiles});
  for (int n : {16, 64, 2048, 4112}) {
    // GEMM1's input: x rows gathered through the map into a poisoned buffer.
    const std::vector<bf16> x = rows_with_specials(kTokens, n, uint32_t(n));
    const std::vector<float> g = global_scales(x);
    DeviceBuffer<bf16> dx(x), dst(size_t(kMaxRows) * n);
    DeviceBuffer<float> dg(g);
    DeviceBuffer<int32_t> rows_out(std::vector<int32_t>(kMaxRows, 12345));
    dst.poison();
    kernels::cuda::nvfp4_fake_quant_expert_rows(
        {dx.get(), true, dst.get(), rows_out.get(), d_p2t.get(), d_tile_expert.get(),
         d_num_tiles.get(), dg.get(), kTile, kMaxRows, n},
        nullptr);
    expect_rows(dst.download(), x, true, p2t, g, n);
    const std::vector<int32_t> rows = rows_out.download();
    for (int r = 0; r < kMaxRows; ++r) {
      const int32_t want = r >= kNumTiles * kTile ? 12345 : p2t[size_t(r)] >= 0 ? r : -1;
      EXPECT_EQ(rows[size_t(r)], want) << "n " << n << " row " << r;
    }

    // GEMM2's input: permuted rows quantized in place; the others keep what they held.
    const std::vector<bf16> act = rows_with_specials(kMaxRows, n, uint32_t(n) + 7);
    DeviceBuffer<bf16> dact(act);
    kernels::cuda::nvfp4_fake_quant_expert_rows(
        {dact.get(), false, dact.get(), nullptr, d_p2t.get(), d_tile_expert.get(),
         d_num_tiles.get(), dg.get(), kTile, kMaxRows, n},
        nullptr);
    expect_rows(dact.download(), act, false, p2t, g, n);
  }
}

}  // namespace
}  // namespace serval::testing
