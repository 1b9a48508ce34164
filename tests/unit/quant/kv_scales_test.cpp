// FP8 KV-cache scale discovery and remapping (SPEC 3).
#include "quant/kv_scales.h"

#include <map>
#include <set>

#include <gtest/gtest.h>

#include "base/error.h"

namespace serval::quant {
namespace {

// A fake checkpoint: name -> tensor; records which names were read.
struct Checkpoint {
  std::map<std::string, Tensor> tensors;
  std::set<std::string> read;

  void add(const std::string& name, float value, Shape shape = {}, DType dtype = DType::kF32) {
    Tensor t = host_empty(dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dtype == DType::kF32) t.as<float>()[i] = value;
      if (dtype == DType::kBF16) t.as<bf16>()[i] = float_to_bf16(value);
      if (dtype == DType::kI32) t.as<int32_t>()[i] = int32_t(value);
    }
    tensors[name] = t;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, t] : tensors) out.push_back(n);
    return out;
  }
  KvScales load(int num_layers, std::string pattern = "model.layers.{i}",
                std::vector<bool> attention = {}) {
    KvScaleOptions o;
    o.num_layers = num_layers;
    o.layer_pattern = std::move(pattern);
    o.attention_layers = std::move(attention);
    std::vector<std::string> n = names();
    return load_kv_scales(n, o, [this](const std::string& name) {
      read.insert(name);
      return tensors.at(name);
    });
  }
};

void expect_load_error_naming(Checkpoint& ck, int layers, const std::string& name) {
  try {
    ck.load(layers);
    ADD_FAILURE() << "no LoadError for " << name;
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
  }
}

struct Variant {
  const char* k;  // suffix after "model.layers.<i>."
  const char* v;
};

TEST(KvScales, EveryNamingVariant) {
  const Variant variants[] = {
      {"self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"},
      {"self_attn.qkv_proj.k_scale", "self_attn.qkv_proj.v_scale"},
      {"self_attn.k_scale", "self_attn.v_scale"},
      {"self_attn.attn.k_scale", "self_attn.attn.v_scale"},
      {"mixer.k_proj.k_scale", "mixer.v_proj.v_scale"},
      {"self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale"},
  };
  for (const Variant& var : variants) {
    Checkpoint ck;
    for (int i = 0; i < 3; ++i) {
      std::string p = "model.layers." + std::to_string(i) + ".";
      ck.add(p + var.k, 0.5f + i);
      ck.add(p + var.v, 0.25f + i);
      ck.add(p + "self_attn.k_proj.weight", 1.0f, {4, 4});  // not a scale
    }
    KvScales s = ck.load(3);
    EXPECT_EQ(s.k, (std::vector<float>{0.5f, 1.5f, 2.5f})) << var.k;
    EXPECT_EQ(s.v, (std::vector<float>{0.25f, 1.25f, 2.25f})) << var.v;
    EXPECT_EQ(s.num_loaded_layers, 3) << var.k;
    EXPECT_EQ(s.num_default_layers, 0);
    EXPECT_TRUE(s.warnings.empty()) << var.k;
    EXPECT_EQ(s.consumed.size(), 6u);
  }
}

TEST(KvScales, LegacyKvScaleSetsBoth) {
  Checkpoint ck;
  ck.add("model.layers.0.self_attn.kv_scale", 0.75f);
  ck.add("model.layers.1.self_attn.attn.kv_scale", 0.125f, {1});
  KvScales s = ck.load(2);
  EXPECT_EQ(s.k, (std::vector<float>{0.75f, 0.125f}));
  EXPECT_EQ(s.v, (std::vector<float>{0.75f, 0.125f}));
  EXPECT_EQ(s.num_loaded_layers, 2);
  EXPECT_TRUE(s.warnings.empty());
}

TEST(KvScales, MixedVariantsAcrossLayers) {
  Checkpoint ck;
  ck.add("model.layers.0.self_attn.k_proj.k_scale", 0.5f);
  ck.add("model.layers.0.self_attn.v_proj.v_scale", 0.25f);
  ck.add("model.layers.1.self_attn.k_scale", 2.0f, {1}, DType::kBF16);
  ck.add("model.layers.1.self_attn.attn.v_scale", 3.0f);
  ck.add("model.layers.2.self_attn.kv_scale", 4.0f);
  ck.add("model.layers.3.self_attn.k_proj.output_scale", 5.0f, {1, 1});
  ck.add("model.layers.3.self_attn.v_proj.output_scale", 6.0f);
  KvScales s = ck.load(4);
  EXPECT_EQ(s.k, (std::vector<float>{0.5f, 2.0f, 4.0f, 5.0f}));
  EXPECT_EQ(s.v, (std::vector<float>{0.25f, 3.0f, 4.0f, 6.0f}));
  EXPECT_EQ(s.num_loaded_layers, 4);
}

TEST(KvScales, UnmappableNamesFailNamingTheTensor) {
  for (const char* bad :
       {"model.layers.99.self_attn.k_scale", "model.layers.4.self_attn.v_scale",
        "model.foo.k_scale", "model.layers.0.self_attn.k_proj.v_scale",
        "model.layers.0.attention.k_scale", "model.layers.01.self_attn.k_scale",
        "model.layers.0.self_attn.o_proj.k_scale", "k_scale", "model.layers.x.self_attn.k_scale",
        "model.layers.2.kv_scale", "model.layers.0.mlp.k_proj.output_scale"}) {
    Checkpoint ck;
    ck.add("model.layers.0.self_attn.k_scale", 1.0f);
    ck.add(bad, 1.0f);
    expect_load_error_naming(ck, 4, bad);
  }
}

TEST(KvScales, BadValuesFail) {
  {
    Checkpoint ck;
    ck.add("model.layers.1.self_attn.k_scale", 1.0f, {2});
    expect_load_error_naming(ck, 2, "model.layers.1.self_attn.k_scale");
  }
  {
    Checkpoint ck;
    ck.add("model.layers.1.self_attn.v_scale", 1.0f, {0});
    expect_load_error_naming(ck, 2, "model.layers.1.self_attn.v_scale");
  }
  for (float v : {0.0f, -1.0f, std::numeric_limits<float>::infinity()}) {
    Checkpoint ck;
    ck.add("model.layers.0.self_attn.k_scale", v);
    expect_load_error_naming(ck, 2, "model.layers.0.self_attn.k_scale");
  }
  {
    Checkpoint ck;
    ck.add("model.layers.0.self_attn.k_scale", 3.0f, {}, DType::kI32);
    expect_load_error_naming(ck, 2, "model.layers.0.self_attn.k_scale");
  }
  {  // one layer's k given twice with different values
    Checkpoint ck;
    ck.add("model.layers.0.self_attn.k_scale", 1.0f);
    ck.add("model.layers.0.self_attn.k_proj.k_scale", 2.0f);
    expect_load_error_naming(ck, 2, "model.layers.0.self_attn.k_proj.k_scale");
  }
  {  // ... the same value twice is accepted
    Checkpoint ck;
    ck.add("model.layers.0.self_attn.kv_scale", 2.0f);
    ck.add("model.layers.0.self_attn.k_proj.k_scale", 2.0f);
    EXPECT_EQ(ck.load(1).k[0], 2.0f);
  }
}

TEST(KvScales, OnlyOneOfKvUsesItForBoth) {
  Checkpoint ck;
  ck.add("model.layers.0.self_attn.k_proj.k_scale", 0.5f);
  ck.add("model.layers.1.self_attn.v_proj.v_scale", 0.75f);
  ck.add("model.layers.2.self_attn.k_proj.k_scale", 0.1f);
  ck.add("model.layers.2.self_attn.v_proj.v_scale", 0.2f);
  KvScales s = ck.load(3);
  EXPECT_EQ(s.k, (std::vector<float>{0.5f, 0.75f, 0.1f}));
  EXPECT_EQ(s.v, (std::vector<float>{0.5f, 0.75f, 0.2f}));
  EXPECT_EQ(s.num_loaded_layers, 3);
  EXPECT_EQ(s.num_default_layers, 0);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("2 of 3"), std::string::npos) << s.warnings[0];
}

TEST(KvScales, NoScalesAtAll) {
  Checkpoint ck;
  ck.add("model.layers.0.self_attn.k_proj.weight", 1.0f, {2, 2});
  KvScales s = ck.load(4);
  EXPECT_EQ(s.k, std::vector<float>(4, 1.0f));
  EXPECT_EQ(s.v, std::vector<float>(4, 1.0f));
  EXPECT_EQ(s.num_loaded_layers, 0);
  EXPECT_EQ(s.num_default_layers, 4);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("4 of 4"), std::string::npos) << s.warnings[0];
  EXPECT_TRUE(s.consumed.empty());
  EXPECT_TRUE(ck.read.empty());
}

TEST(KvScales, SomeLayersDefaulted) {
  Checkpoint ck;
  ck.add("model.layers.1.self_attn.k_scale", 0.5f);
  ck.add("model.layers.1.self_attn.v_scale", 0.5f);
  KvScales s = ck.load(3);
  EXPECT_EQ(s.k, (std::vector<float>{1.0f, 0.5f, 1.0f}));
  EXPECT_EQ(s.num_loaded_layers, 1);
  EXPECT_EQ(s.num_default_layers, 2);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("2 of 3"), std::string::npos) << s.warnings[0];
}

TEST(KvScales, OtherScalesAreNotSwallowed) {
  const char* others[] = {"model.layers.0.self_attn.k_proj.weight_scale",
                          "model.layers.0.self_attn.k_proj.input_scale",
                          "model.layers.0.self_attn.k_proj.weight_scale_2",
                          "model.layers.0.self_attn.k_proj.weight_scale_inv",
                          "model.layers.0.self_attn.v_proj.weight_global_scale",
                          "model.layers.0.self_attn.q_proj.output_scale",
                          "model.layers.0.self_attn.o_proj.output_scale",
                          "model.layers.0.self_attn.q_scale",
                          "model.layers.0.self_attn.prob_scale",
                          "model.layers.0.mlp.experts.0.down_proj.input_scale",
                          "model.layers.0.self_attn.k_proj.weight_scale_kv",
                          "model.layers.0.self_attn.k_norm.weight"};
  Checkpoint ck;
  for (const char* n : others) {
    EXPECT_FALSE(is_kv_scale_name(n)) << n;
    ck.add(n, 1.0f, {3});  // would fail the scalar check if it were read
  }
  ck.add("model.layers.0.self_attn.k_proj.k_scale", 0.5f);
  KvScales s = ck.load(1);
  EXPECT_EQ(s.consumed, std::vector<std::string>{"model.layers.0.self_attn.k_proj.k_scale"});
  EXPECT_EQ(ck.read, std::set<std::string>{"model.layers.0.self_attn.k_proj.k_scale"});
  EXPECT_TRUE(is_kv_scale_name("model.layers.0.self_attn.kv_scale"));
  EXPECT_TRUE(is_kv_scale_name("model.layers.0.self_attn.v_proj.output_scale"));
}

TEST(KvScales, LayerPatternAndHybridAttentionLayers) {
  Checkpoint ck;
  ck.add("language_model.model.layers.0.self_attn.k_scale", 0.5f);
  ck.add("language_model.model.layers.0.self_attn.v_scale", 0.5f);
  KvScales s = ck.load(2, "language_model.model.layers.{i}");
  EXPECT_EQ(s.num_loaded_layers, 1);
  EXPECT_EQ(s.num_default_layers, 1);
  // The default pattern does not claim them.
  expect_load_error_naming(ck, 2, "language_model.model.layers.0.self_attn.k_scale");

  Checkpoint hy;  // layers 0, 2 are mamba; 1, 3 attention
  hy.add("model.layers.1.mixer.k_proj.k_scale", 0.5f);
  hy.add("model.layers.1.mixer.v_proj.v_scale", 0.25f);
  KvScales h = hy.load(4, "model.layers.{i}", {false, true, false, true});
  EXPECT_EQ(h.k, (std::vector<float>{1.0f, 0.5f, 1.0f, 1.0f}));
  EXPECT_EQ(h.num_loaded_layers, 1);
  EXPECT_EQ(h.num_default_layers, 1);
  ASSERT_EQ(h.warnings.size(), 1u);
  EXPECT_NE(h.warnings[0].find("1 of 2"), std::string::npos) << h.warnings[0];
  hy.add("model.layers.2.mixer.k_proj.k_scale", 0.5f);
  try {
    hy.load(4, "model.layers.{i}", {false, true, false, true});
    ADD_FAILURE();
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.mixer.k_proj.k_scale"), std::string::npos);
  }
  EXPECT_THROW(ck.load(2, "model.layers"), InvalidArgument);
  EXPECT_THROW(ck.load(2, "model.layers.{i}", {true}), InvalidArgument);
}

}  // namespace
}  // namespace serval::quant
