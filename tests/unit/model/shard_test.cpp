// slice_quantized on hand-made weights of every format: the sliced weight dequantizes (CPU
// reference kernel) to exactly the rows and columns it names of the whole weight's dequantized
// matrix, and slices off the scale grid are LoadErrors.
#include "model/layers/shard.h"

#include <gtest/gtest.h>

#include <random>

#include "base/error.h"
#include "kernels/cpu/quant_linear.h"

namespace serval::model {
namespace {

using kernels::WeightFormat;

// W as a dense [n, k] f32 matrix: x = identity rows through the reference kernel gives Wᵀ.
std::vector<float> dequant(const backend::QuantizedWeight& q) {
  std::vector<float> x(size_t(q.k) * q.k, 0.0f), y(size_t(q.k) * q.n);
  for (int i = 0; i < q.k; ++i) x[size_t(i) * q.k + i] = 1.0f;
  kernels::QuantLinearParams p{};
  p.x = x.data();
  p.format = q.format;
  p.w = static_cast<const uint8_t*>(q.data.data);
  p.scales = q.scales.data;
  p.global_scale = q.global_scale.at(0);
  p.block_n = q.block_n;
  p.block_k = q.block_k;
  p.y = y.data();
  p.m = q.k;
  p.n = q.n;
  p.k = q.k;
  kernels::cpu::quant_linear(p);
  std::vector<float> w(size_t(q.n) * q.k);
  for (int r = 0; r < q.n; ++r)
    for (int c = 0; c < q.k; ++c) w[size_t(r) * q.k + c] = y[size_t(c) * q.n + r];
  return w;
}

// Random codes and valid scales of an [n, k] weight of `format` (FP8 block: 16 × 16 blocks).
backend::QuantizedWeight make(WeightFormat format, int n, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  backend::QuantizedWeight q;
  q.format = format;
  q.n = n;
  q.k = k;
  q.global_scale = {0.75f};
  q.input_scale = {1.0f};
  auto bytes = [&](DType t, Shape shape, int lo, int hi) {
    Tensor out = host_empty(t, std::move(shape));
    auto* p = static_cast<uint8_t*>(out.data);
    for (size_t i = 0; i < out.nbytes(); ++i) p[i] = uint8_t(lo + int(rng() % uint32_t(hi - lo)));
    return out;
  };
  auto floats = [&](Shape shape) {
    Tensor out = host_empty(DType::kF32, std::move(shape));
    for (int64_t i = 0; i < out.numel(); ++i) out.as<float>()[i] = 0.25f + float(rng() % 8) / 8;
    return out;
  };
  switch (format) {
    case WeightFormat::kNvfp4:
      q.data = bytes(DType::kU8, {n, k / 2}, 0, 256);
      q.scales = bytes(DType::kF8E4M3, {n, k / 16}, 0x30, 0x48);
      break;
    case WeightFormat::kFp8PerTensor:
      q.data = bytes(DType::kF8E4M3, {n, k}, 0x00, 0x70);
      break;
    case WeightFormat::kFp8PerChannel:
      q.data = bytes(DType::kF8E4M3, {n, k}, 0x00, 0x70);
      q.scales = floats({n});
      break;
    case WeightFormat::kFp8Block:
      q.block_n = q.block_k = 16;
      q.data = bytes(DType::kF8E4M3, {n, k}, 0x00, 0x70);
      q.scales = floats({(n + 15) / 16, (k + 15) / 16});
      break;
  }
  return q;
}

TEST(SliceQuantized, DequantizesToTheNamedRowsAndColumns) {
  uint32_t seed = 1;
  for (WeightFormat format : {WeightFormat::kNvfp4, WeightFormat::kFp8PerTensor,
                              WeightFormat::kFp8PerChannel, WeightFormat::kFp8Block}) {
    const int n = 72, k = 96;
    const backend::QuantizedWeight q = make(format, n, k, seed++);
    const std::vector<float> whole = dequant(q);
    // Fused-part-like row ranges (q, then k of a qkv), and a column-parallel or row-parallel
    // slice; the last row range ends at n inside an FP8 block (rows 64..71).
    const std::vector<dist::Range> rows = {{16, 32}, {48, 72}};
    for (dist::Range cols : {dist::Range{0, 96}, dist::Range{32, 64}, dist::Range{48, 96}}) {
      SCOPED_TRACE(std::string(backend::weight_format_name(format)) + " cols [" +
                   std::to_string(cols.begin) + ", " + std::to_string(cols.end) + ")");
      const backend::QuantizedWeight s = slice_quantized(q, rows, cols, "test");
      ASSERT_EQ(s.n, 40);
      ASSERT_EQ(s.k, cols.size());
      EXPECT_EQ(s.global_scale, q.global_scale);
      const std::vector<float> got = dequant(s);
      int r_out = 0, bad = 0;
      for (const dist::Range& r : rows)
        for (int64_t row = r.begin; row < r.end; ++row, ++r_out)
          for (int64_t c = cols.begin; c < cols.end; ++c)
            bad += got[size_t(r_out) * s.k + size_t(c - cols.begin)] !=
                   whole[size_t(row) * k + size_t(c)];
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(SliceQuantized, SlicesOffTheScaleGridAreLoadErrors) {
  const backend::QuantizedWeight nvfp4 = make(WeightFormat::kNvfp4, 32, 64, 7);
  EXPECT_THROW(slice_quantized(nvfp4, {{0, 32}}, {8, 64}, "nvfp4"), LoadError);  // mid-group
  EXPECT_THROW(slice_quantized(nvfp4, {{0, 32}}, {0, 40}, "nvfp4"), LoadError);
  EXPECT_THROW(slice_quantized(nvfp4, {{0, 40}}, {0, 64}, "nvfp4"), LoadError);  // past n
  EXPECT_NO_THROW(slice_quantized(nvfp4, {{3, 5}, {7, 9}}, {16, 48}, "nvfp4"));  // any rows
  const backend::QuantizedWeight block = make(WeightFormat::kFp8Block, 40, 64, 8);
  EXPECT_THROW(slice_quantized(block, {{0, 8}, {16, 32}}, {0, 64}, "block"), LoadError);
  EXPECT_THROW(slice_quantized(block, {{8, 16}}, {0, 64}, "block"), LoadError);
  EXPECT_THROW(slice_quantized(block, {{0, 16}}, {8, 64}, "block"), LoadError);
  EXPECT_NO_THROW(slice_quantized(block, {{0, 16}, {32, 40}}, {16, 64}, "block"));
  try {
    slice_quantized(block, {{0, 16}}, {8, 64}, "model.layers.0.self_attn.o_proj");
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("o_proj"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace serval::model
