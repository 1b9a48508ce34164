// Expected checkpoint tensors per quantization method, and shard-fusion scale arithmetic.
#include "quant/weight_names.h"

#include <cmath>

#include <gtest/gtest.h>

#include "base/error.h"

namespace serval::quant {
namespace {

using Method = QuantConfig::Method;

QuantConfig make(Method m) {
  QuantConfig c;
  c.method = m;
  c.source = "test";
  return c;
}

TEST(LinearTensors, Nvfp4ModelOpt) {
  QuantConfig c = make(Method::kNvfp4);
  c.group_size = 16;
  c.static_activations = true;
  c.exclude_globs = {"lm_head"};
  auto t = linear_tensors(c, "model.layers.0.self_attn.q_proj", 4096, 2048, DType::kBF16);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(t[0].dtypes, std::vector<DType>{DType::kU8});
  EXPECT_EQ(t[0].shapes, std::vector<Shape>{(Shape{4096, 1024})});
  EXPECT_EQ(t[1].name, "model.layers.0.self_attn.q_proj.weight_scale");
  EXPECT_EQ(t[1].dtypes, std::vector<DType>{DType::kF8E4M3});
  EXPECT_EQ(t[1].shapes, std::vector<Shape>{(Shape{4096, 128})});
  EXPECT_EQ(t[2].name, "model.layers.0.self_attn.q_proj.weight_scale_2");
  EXPECT_TRUE(matches(t[2], DType::kF32, Shape{}));
  EXPECT_TRUE(matches(t[2], DType::kF32, Shape{1}));
  EXPECT_FALSE(matches(t[2], DType::kF32, Shape{2}));
  EXPECT_EQ(t[3].name, "model.layers.0.self_attn.q_proj.input_scale");

  // Excluded module: plain weight in the model dtype.
  auto head = linear_tensors(c, "lm_head", 151936, 2048, DType::kBF16);
  ASSERT_EQ(head.size(), 1u);
  EXPECT_EQ(head[0].name, "lm_head.weight");
  EXPECT_TRUE(matches(head[0], DType::kBF16, Shape{151936, 2048}));
  EXPECT_FALSE(matches(head[0], DType::kU8, Shape{151936, 1024}));

  EXPECT_THROW(linear_tensors(c, "x", 16, 40, DType::kBF16), InvalidArgument);
}

TEST(LinearTensors, Nvfp4CompressedTensors) {
  QuantConfig c = make(Method::kNvfp4);
  c.group_size = 16;
  c.reciprocal_global_scales = true;
  c.static_activations = true;
  auto t = linear_tensors(c, "p", 32, 64, DType::kBF16);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].name, "p.weight_packed");
  EXPECT_TRUE(matches(t[0], DType::kU8, Shape{32, 32}));
  EXPECT_EQ(t[1].name, "p.weight_scale");
  EXPECT_TRUE(matches(t[1], DType::kF8E4M3, Shape{32, 4}));
  EXPECT_EQ(t[2].name, "p.weight_global_scale");
  EXPECT_EQ(t[3].name, "p.input_global_scale");
  c.static_activations = false;  // NVFP4A16: no activation scale
  EXPECT_EQ(linear_tensors(c, "p", 32, 64, DType::kBF16).size(), 3u);
  EXPECT_FLOAT_EQ(nvfp4_scale_from_checkpoint(c, 4.0f), 0.25f);
  c.reciprocal_global_scales = false;
  EXPECT_FLOAT_EQ(nvfp4_scale_from_checkpoint(c, 4.0f), 4.0f);
}

TEST(LinearTensors, Fp8Methods) {
  QuantConfig pt = make(Method::kFp8PerTensor);
  pt.static_activations = true;
  auto t = linear_tensors(pt, "p", 300, 200, DType::kBF16);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_TRUE(matches(t[0], DType::kF8E4M3, Shape{300, 200}));
  EXPECT_EQ(t[1].name, "p.weight_scale");
  EXPECT_TRUE(matches(t[1], DType::kF32, Shape{}));
  EXPECT_TRUE(matches(t[1], DType::kBF16, Shape{1}));
  EXPECT_EQ(t[2].name, "p.input_scale");
  pt.static_activations = false;
  EXPECT_EQ(linear_tensors(pt, "p", 300, 200, DType::kBF16).size(), 2u);

  QuantConfig pc = make(Method::kFp8PerChannel);
  auto c = linear_tensors(pc, "p", 300, 200, DType::kBF16);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_TRUE(matches(c[1], DType::kF32, Shape{300, 1}));
  EXPECT_TRUE(matches(c[1], DType::kF32, Shape{300}));
  EXPECT_FALSE(matches(c[1], DType::kF32, Shape{200}));

  QuantConfig b = make(Method::kFp8Block);
  b.block_size = {128, 128};
  b.block_scale_name = "weight_scale_inv";
  auto bl = linear_tensors(b, "p", 300, 200, DType::kBF16);
  ASSERT_EQ(bl.size(), 2u);
  EXPECT_EQ(bl[1].name, "p.weight_scale_inv");
  EXPECT_EQ(bl[1].shapes, std::vector<Shape>{(Shape{3, 2})});  // ceil(300/128), ceil(200/128)
  b.block_size = {64, 128};
  EXPECT_EQ(linear_tensors(b, "p", 256, 128, DType::kBF16)[1].shapes,
            std::vector<Shape>{(Shape{4, 1})});
}

TEST(CheckTensor, NamesTensorAndExpectation) {
  ExpectedTensor e{"model.layers.3.mlp.down_proj.weight_scale", {DType::kF8E4M3}, {Shape{8, 4}}};
  EXPECT_NO_THROW(check_tensor(e, DType::kF8E4M3, Shape{8, 4}));
  try {
    check_tensor(e, DType::kF32, Shape{8, 4});
    ADD_FAILURE();
  } catch (const LoadError& err) {
    std::string msg = err.what();
    EXPECT_NE(msg.find("model.layers.3.mlp.down_proj.weight_scale"), std::string::npos) << msg;
  }
  EXPECT_THROW(check_tensor(e, DType::kF8E4M3, Shape{4, 8}), LoadError);
}

// e4m3fn bytes used below: 0x38 = 1.0, 0x3C = 1.5, 0x40 = 2.0, 0x34 = 0.75, 0x30 = 0.5,
// 0x32 = 0.625, 0x2A = 0.3125, 0x28 = 0.25, 0x08 = 2^-6 (min normal), 0x04 = 2^-7 (subnormal).
TEST(FuseNvfp4, MaxScaleAndRescaledBlockScales) {
  std::vector<uint8_t> a = {0x40, 0x3C}, b = {0x40, 0x3C, 0x08}, c = {0x38, 0x38};
  Nvfp4Shard shards[] = {{2.0f, 0.1f, a}, {1.0f, 0.4f, b}, {0.6f, 0.2f, c}};
  Nvfp4Fused f = fuse_nvfp4_shards(shards);
  EXPECT_EQ(f.weight_scale_2, 2.0f);
  EXPECT_EQ(f.input_scale, 0.4f);
  // a holds the max: unchanged. b: ratio 0.5 -> 1.0, 0.75, 2^-7 (subnormal).
  // c: ratio 0.3 -> 0.3 rounds to 0.3125 (neighbours 0.28125, 0.3125; midpoint 0.296875).
  std::vector<uint8_t> want = {0x40, 0x3C, 0x38, 0x34, 0x04, 0x2A, 0x2A};
  EXPECT_EQ(f.block_scales, want);
  // Dequantized blocks are preserved where representable: sf' · max == sf · s_i.
  EXPECT_EQ(e4m3_to_float(f.block_scales[3]) * f.weight_scale_2, e4m3_to_float(0x3C) * 1.0f);
}

TEST(FuseNvfp4, RoundsHalfToEven) {
  // 1.0 · 0.53125 lies halfway between 0.5 (mantissa 000) and 0.5625 (001): even -> 0.5.
  // 1.0 · 0.59375 lies halfway between 0.5625 (001) and 0.625 (010): even -> 0.625.
  std::vector<uint8_t> one = {0x38};
  Nvfp4Shard shards[] = {{1.0f, 1.0f, one}, {0.53125f, 1.0f, one}, {0.59375f, 1.0f, one}};
  Nvfp4Fused f = fuse_nvfp4_shards(shards);
  EXPECT_EQ(f.block_scales, (std::vector<uint8_t>{0x38, 0x30, 0x32}));
}

TEST(FuseNvfp4, EdgeCases) {
  std::vector<uint8_t> s = {0x38};
  Nvfp4Shard zeros[] = {{0.0f, 0.0f, s}, {0.0f, 0.0f, s}};
  EXPECT_EQ(fuse_nvfp4_shards(zeros).block_scales, (std::vector<uint8_t>{0x38, 0x38}));
  Nvfp4Shard one_zero[] = {{1.0f, 1.0f, s}, {0.0f, 1.0f, s}};
  EXPECT_EQ(fuse_nvfp4_shards(one_zero).block_scales, (std::vector<uint8_t>{0x38, 0x00}));
  Nvfp4Shard nan[] = {{std::nanf(""), 1.0f, s}};
  EXPECT_THROW(fuse_nvfp4_shards(nan), InvalidArgument);
  EXPECT_THROW(fuse_nvfp4_shards({}), InvalidArgument);
}

TEST(FuseFp8, RequantizesToMaxScale) {
  std::vector<uint8_t> a = {0x38, 0xB8, 0x40}, b = {0x40, 0x7E};
  Fp8Shard shards[] = {{0.5f, 0.3f, a}, {2.0f, 0.2f, b}};
  Fp8Fused f = fuse_fp8_per_tensor_shards(shards);
  EXPECT_EQ(f.weight_scale, 2.0f);
  EXPECT_EQ(f.input_scale, 0.3f);
  // a: 1.0·0.5/2 = 0.25, -0.25, 2·0.5/2 = 0.5; b unchanged (448 stays 0x7E).
  EXPECT_EQ(f.weight, (std::vector<uint8_t>{0x28, 0xA8, 0x30, 0x40, 0x7E}));
  // 1.5 · 0.53125 / 1 = 0.796875 between 0.75 (0x34) and 0.8125 (0x35): nearer 0.8125.
  std::vector<uint8_t> c = {0x3C}, d = {0x38};
  Fp8Shard s2[] = {{0.53125f, 1.0f, c}, {1.0f, 1.0f, d}};
  EXPECT_EQ(fuse_fp8_per_tensor_shards(s2).weight, (std::vector<uint8_t>{0x35, 0x38}));
}

TEST(CheckBlockFusable, RowsMustFillBlocks) {
  int64_t ok[] = {256, 128, 100};
  EXPECT_NO_THROW(check_block_fusable("qkv", ok, 128));
  int64_t bad[] = {256, 100, 128};
  EXPECT_THROW(check_block_fusable("qkv", bad, 128), LoadError);
}

}  // namespace
}  // namespace serval::quant
