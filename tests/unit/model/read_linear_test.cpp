// read_linear on small hand-written checkpoints: dense fallback for excluded modules, NVFP4
// fusion with different global scales, and LoadErrors that name the offending tensor.
#include <gtest/gtest.h>

#include <cstring>

#include "base/error.h"
#include "model/quantized_weight.h"
#include "unit/io/safetensors_writer.h"

namespace serval {
namespace {

using io::testing::TensorSpec;

std::vector<uint8_t> f32(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

// NVFP4 tensors of module `m` with n rows, k = 32, block-scale byte `sf` and global scale `g`.
void add_nvfp4(std::vector<TensorSpec>& t, const std::string& m, int64_t n, uint8_t sf, float g,
               const std::string& scale_dtype = "F8_E4M3") {
  t.push_back({m + ".weight", "U8", {n, 16}, io::testing::pattern(size_t(n) * 16, uint8_t(n))});
  t.push_back({m + ".weight_scale", scale_dtype, {n, 2}, std::vector<uint8_t>(size_t(n) * 2, sf)});
  t.push_back({m + ".weight_scale_2", "F32", {}, f32(g)});
  t.push_back({m + ".input_scale", "F32", {}, f32(0.5f * g)});
}

void write_model(const io::testing::TempDir& dir, const std::vector<TensorSpec>& t) {
  io::testing::write_file(dir / "model.safetensors", io::testing::safetensors_bytes(t));
  io::testing::write_file(dir / "hf_quant_config.json",
                          std::string(R"({"quantization": {"quant_algo": "NVFP4", "group_size": 16,
                              "exclude_modules": ["lm_head", "*.mlp.gate"]}})"));
}

TEST(ReadLinear, FusesNvfp4ShardsAtTheMaxGlobalScale) {
  io::testing::TempDir dir;
  std::vector<TensorSpec> t;
  add_nvfp4(t, "a.q_proj", 4, 0x40 /* 2.0 */, 0.5f);
  add_nvfp4(t, "a.k_proj", 2, 0x40, 2.0f);
  write_model(dir, t);
  auto w = model::open_checkpoint_weights(dir.str());
  backend::Weight fused = model::read_linear(*w, {{"a.q_proj", 4}, {"a.k_proj", 2}}, 32);
  ASSERT_TRUE(fused.quantized());
  const backend::QuantizedWeight& q = *fused.q;
  EXPECT_EQ(q.n, 6);
  EXPECT_EQ(q.k, 32);
  EXPECT_EQ(q.global_scale, std::vector<float>{2.0f});
  EXPECT_EQ(q.input_scale, std::vector<float>{1.0f});  // max of 0.25 and 1.0
  ASSERT_EQ(q.scales.shape, (Shape{6, 2}));
  // q_proj's scales 2.0 · (0.5 / 2.0) = 0.5 (e4m3 0x30); k_proj's unchanged.
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.scales.as<uint8_t>()[i], 0x30) << i;
  for (int i = 8; i < 12; ++i) EXPECT_EQ(q.scales.as<uint8_t>()[i], 0x40) << i;
  // Codes are stacked unchanged.
  EXPECT_EQ(std::memcmp(q.data.data, io::testing::pattern(64, 4).data(), 64), 0);
  EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(q.data.data) + 64,
                        io::testing::pattern(32, 2).data(), 32),
            0);
}

TEST(ReadLinear, ExcludedModuleLoadsDense) {
  io::testing::TempDir dir;
  std::vector<TensorSpec> t;
  t.push_back({"l.mlp.gate.weight", "F32", {2, 4}, std::vector<uint8_t>(32, 0)});
  write_model(dir, t);
  auto w = model::open_checkpoint_weights(dir.str());
  backend::Weight r = model::read_linear(*w, {{"l.mlp.gate", 2}}, 4);
  EXPECT_FALSE(r.quantized());
  EXPECT_EQ(r.dense.shape, (Shape{2, 4}));
  EXPECT_EQ(r.out_features(), 2);
}

TEST(ReadLinear, WrongScaleDtypeNamesTheTensor) {
  io::testing::TempDir dir;
  std::vector<TensorSpec> t;
  add_nvfp4(t, "a.o_proj", 4, 0x40, 1.0f, "U8");
  write_model(dir, t);
  auto w = model::open_checkpoint_weights(dir.str());
  try {
    model::read_linear(*w, {{"a.o_proj", 4}}, 32);
    FAIL() << "expected LoadError";
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("a.o_proj.weight_scale"), std::string::npos) << e.what();
  }
}

TEST(ReadLinear, MissingTensorAndWrongShapeAreLoadErrors) {
  io::testing::TempDir dir;
  std::vector<TensorSpec> t;
  add_nvfp4(t, "a.o_proj", 4, 0x40, 1.0f);
  t.erase(t.begin() + 2);  // no weight_scale_2
  write_model(dir, t);
  auto w = model::open_checkpoint_weights(dir.str());
  EXPECT_THROW(model::read_linear(*w, {{"a.o_proj", 4}}, 32), LoadError);
  EXPECT_THROW(model::read_linear(*w, {{"a.o_proj", 4}}, 64), LoadError);  // K mismatch
}

TEST(ReadLinear, ShardsMixingQuantizedAndExcludedAreRejected) {
  io::testing::TempDir dir;
  std::vector<TensorSpec> t;
  add_nvfp4(t, "x.up_proj", 4, 0x40, 1.0f);
  t.push_back({"x.mlp.gate.weight", "F32", {4, 32}, std::vector<uint8_t>(512, 0)});
  write_model(dir, t);
  auto w = model::open_checkpoint_weights(dir.str());
  EXPECT_THROW(model::read_linear(*w, {{"x.mlp.gate", 4}, {"x.up_proj", 4}}, 32), LoadError);
}

TEST(ReadLinear, StackExpertsKeepsPerExpertScales) {
  io::testing::TempDir dir;
  std::vector<TensorSpec> t;
  add_nvfp4(t, "e0", 2, 0x40, 1.0f);
  add_nvfp4(t, "e1", 2, 0x38, 3.0f);
  write_model(dir, t);
  auto w = model::open_checkpoint_weights(dir.str());
  backend::QuantizedWeight s = model::stack_experts(
      {*model::read_linear(*w, {{"e0", 2}}, 32).q, *model::read_linear(*w, {{"e1", 2}}, 32).q});
  EXPECT_EQ(s.experts, 2);
  EXPECT_EQ(s.data.shape, (Shape{2, 2, 16}));
  EXPECT_EQ(s.scales.shape, (Shape{2, 2, 2}));
  EXPECT_EQ(s.global_scale, (std::vector<float>{1.0f, 3.0f}));
  EXPECT_EQ(s.input_scale, (std::vector<float>{0.5f, 1.5f}));
  EXPECT_EQ(s.scales.as<uint8_t>()[4], 0x38);
  EXPECT_EQ(s.data_bytes(), 32u);
}

}  // namespace
}  // namespace serval
