// The FP8 expert layout of the CUDA MoE GEMMs (kernels/moe_fp8_layout.h) and the host-built
// scales (backend/moe/moe_fp8_scales.h), checked on the CPU: the layout is a bijection whose
// bytes are the mma.sync A fragments decode_step<false> expects, and the scales land on the
// padded rows and 16-column steps they belong to.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "backend/moe/moe_fp8_scales.h"
#include "base/dtype.h"
#include "base/error.h"
#include "kernels/moe_fp8_layout.h"

namespace serval::backend::moe {
namespace {

using kernels::moe_fp8_byte_offset;
using kernels::moe_fp8_element_at;
using kernels::moe_padded_source_row;

TEST(MoeFp8Layout, OffsetsAreABijectionWithTheirInverse) {
  const int rows = 48, k = 192;
  std::set<size_t> seen;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < k; ++c) {
      const size_t o = moe_fp8_byte_offset(r, c, k);
      ASSERT_LT(o, size_t(rows) * k) << r << "," << c;
      ASSERT_TRUE(seen.insert(o).second) << "offset " << o << " taken twice";
      const kernels::MoeFp8Element e = moe_fp8_element_at(o, k);
      ASSERT_EQ(e.row, r);
      ASSERT_EQ(e.col, c);
    }
}

// Reads each lane's words back the way the GEMM does (16 bytes at 16·lane, 16 more at
// 512 + 16·lane) and checks every byte against the m16n8k16 A-fragment definition:
// a0 = (g, 2t4 + {0,1}), a1 = (g+8, same), a2 = (g, 2t4 + 8 + {0,1}), a3 = (g+8, same) of each
// k16 step; register a_{2j} in bytes 1 (even column) and 3, a_{2j+1} in bytes 0 and 2 of word
// 2·step + j.
TEST(MoeFp8Layout, LaneWordsHoldTheMmaFragments) {
  const int rows = 32, k = 128;
  std::vector<uint8_t> w(size_t(rows) * k), packed(w.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t(i * 37 + 11);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < k; ++c) packed[moe_fp8_byte_offset(r, c, k)] = w[size_t(r) * k + c];
  for (int mt = 0; mt < rows / 16; ++mt)
    for (int kb = 0; kb < k / 64; ++kb) {
      const uint8_t* tile = packed.data() + (size_t(mt) * (k / 64) + kb) * 1024;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t4 = lane % 4;
        for (int word = 0; word < 8; ++word) {
          const uint8_t* bytes = tile + (word / 4) * 512 + lane * 16 + (word % 4) * 4;
          const int step = word / 2, j = word % 2;
          const int col = 64 * kb + 16 * step + 8 * j + 2 * t4;
          const int row_lo = 16 * mt + g, row_hi = row_lo + 8;
          auto at = [&](int r, int c) { return w[size_t(r) * k + c]; };
          EXPECT_EQ(bytes[1], at(row_lo, col));
          EXPECT_EQ(bytes[3], at(row_lo, col + 1));
          EXPECT_EQ(bytes[0], at(row_hi, col));
          EXPECT_EQ(bytes[2], at(row_hi, col + 1));
        }
      }
    }
}

TEST(MoeFp8Layout, PaddedSourceRows) {
  // Plain: rows past the source are padding.
  EXPECT_EQ(moe_padded_source_row(5, 10, 16, false), 5);
  EXPECT_EQ(moe_padded_source_row(10, 10, 16, false), -1);
  // Gated: 2 × 40 source rows in 2 × 48 padded rows.
  EXPECT_EQ(moe_padded_source_row(39, 80, 96, true), 39);
  EXPECT_EQ(moe_padded_source_row(40, 80, 96, true), -1);
  EXPECT_EQ(moe_padded_source_row(48, 80, 96, true), 40);
  EXPECT_EQ(moe_padded_source_row(87, 80, 96, true), 79);
  EXPECT_EQ(moe_padded_source_row(88, 80, 96, true), -1);
}

// Gated stack: 2 experts, inter 48 (padded 64), k 160 (padded 192), 16 × 32 blocks.
TEST(MoeFp8Scales, BlockMultipliersFollowPaddedRowsAndSteps) {
  const MoeFp8Geometry g{2, 96, 160, 128, 192, true};
  const int bn = 16, bk = 32, brows = 6, bcols = 5;
  std::vector<float> scales(size_t(2) * brows * bcols);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.001f * float(i + 1);
  const std::vector<bf16> m = moe_fp8_block_multipliers(scales.data(), bn, bk, g);
  ASSERT_EQ(m.size(), kernels::moe_fp8_multiplier_count(2, 128, 192));
  auto mult = [&](int e, int mt, int kb, int step) {
    return bf16_to_float(m[((size_t(e) * 8 + mt) * 3 + kb) * 4 + step]);
  };
  auto want = [&](int e, int brow, int col) {
    return bf16_to_float(
        float_to_bf16(std::ldexp(scales[(size_t(e) * brows + brow) * bcols + col / bk], 120)));
  };
  // Gate rows 16..31 (block row 1), columns 64 + 16·step.
  for (int step = 0; step < 4; ++step) EXPECT_EQ(mult(1, 1, 1, step), want(1, 1, 64 + 16 * step));
  // The gate half's padding (rows 48..63) and the columns past 160 are zero.
  EXPECT_EQ(mult(0, 3, 0, 0), 0.0f);
  EXPECT_EQ(mult(0, 0, 2, 2), 0.0f);  // column 160
  EXPECT_EQ(mult(0, 0, 2, 1), want(0, 0, 144));
  // Up rows: padded 64.. are source 48.. (block row 3).
  EXPECT_EQ(mult(0, 4, 0, 1), want(0, 3, 16));
  EXPECT_EQ(mult(1, 6, 2, 0), want(1, 5, 128));
}

TEST(MoeFp8Scales, BlocksThatCannotBeAppliedPerFragmentAreRefused) {
  std::vector<float> scales(1024, 0.01f);
  // 24-row blocks: not a multiple of 16.
  EXPECT_THROW(moe_fp8_block_multipliers(scales.data(), 24, 64, {1, 64, 64, 64, 64, false}),
               InvalidArgument);
  // Gate half of 40 rows with 16-row blocks: up rows 40..55 span blocks 2 and 3.
  EXPECT_THROW(moe_fp8_block_multipliers(scales.data(), 16, 64, {1, 80, 64, 96, 64, true}),
               InvalidArgument);
  // 40-row blocks: whole gate halves, but not a multiple of 16.
  EXPECT_THROW(moe_fp8_block_multipliers(scales.data(), 40, 64, {1, 80, 64, 96, 64, true}),
               InvalidArgument);
  // Scales the bf16 multiplier cannot hold: 255.9 · 2^120 rounds to infinity (255 does not).
  for (float s : {300.0f, 255.9f, -1.0f}) {
    std::vector<float> bad(4, s);
    EXPECT_THROW(moe_fp8_block_multipliers(bad.data(), 128, 128, {1, 32, 64, 32, 64, false}),
                 InvalidArgument)
        << s;
  }
  std::vector<float> edge(4, 255.0f);
  const std::vector<bf16> m =
      moe_fp8_block_multipliers(edge.data(), 128, 128, {1, 32, 64, 32, 64, false});
  EXPECT_EQ(bf16_to_float(m[0]), std::ldexp(255.0f, 120));
}

TEST(MoeFp8Scales, RowScalesPerChannelAndPerTensor) {
  const MoeFp8Geometry g{2, 20, 64, 32, 64, true};  // gate/up halves of 10 rows, padded to 16
  std::vector<float> channel(40);
  for (size_t i = 0; i < channel.size(); ++i) channel[i] = float(i + 1);
  const std::vector<float> per_expert = {0.5f, 0.25f};
  const std::vector<float> c = moe_fp8_row_scales(channel.data(), per_expert, g);
  ASSERT_EQ(c.size(), 64u);
  EXPECT_EQ(c[3], 4.0f);         // expert 0, gate row 3
  EXPECT_EQ(c[10], 0.0f);        // gate padding
  EXPECT_EQ(c[16], 11.0f);       // expert 0, up row 0 = source row 10
  EXPECT_EQ(c[32 + 25], 40.0f);  // expert 1, up row 9 = source row 19
  EXPECT_EQ(c[32 + 26], 0.0f);   // up padding
  const std::vector<float> t = moe_fp8_row_scales(nullptr, per_expert, g);
  EXPECT_EQ(t[0], 0.5f);
  EXPECT_EQ(t[12], 0.0f);
  EXPECT_EQ(t[32 + 17], 0.25f);
  EXPECT_THROW(moe_fp8_row_scales(nullptr, std::vector<float>{1.0f}, g), InvalidArgument);
  EXPECT_THROW(moe_fp8_row_scales(nullptr, std::vector<float>{1.0f, NAN}, g), InvalidArgument);
}

}  // namespace
}  // namespace serval::backend::moe
