// FP8 KV cache on the CPU backend: k/v scales found under every checkpoint naming scheme
// (SPEC §3) reach the right layers, bad scale tensors fail loading with their names, and fp8
// attention stays close to the f32 cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "io/safetensors.h"
#include "runtime/engine_loader.h"
#include "support/compare.h"
#include "unit/io/safetensors_writer.h"

namespace serval::runtime {
namespace {

namespace fs = std::filesystem;
using io::testing::safetensors_dtype;
using io::testing::TensorSpec;

const fs::path kFixture = fs::path(SERVAL_SOURCE_DIR) / "tests/fixtures/llama";  // 3 layers

TensorSpec scalar(const std::string& name, float v) {
  std::vector<uint8_t> bytes(4);
  std::memcpy(bytes.data(), &v, 4);
  return {name, "F32", {}, bytes};
}

// A copy of the llama fixture whose model.safetensors also holds `extra`.
fs::path fixture_with(const std::string& tag, const std::vector<TensorSpec>& extra) {
  fs::path dir =
      fs::temp_directory_path() / ("serval_kv_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json"})
    fs::copy_file(kFixture / f, dir / f);
  auto original = io::SafetensorsFile::open((kFixture / "model.safetensors").string());
  std::vector<TensorSpec> tensors = extra;
  for (const io::TensorInfo& t : original->tensors())
    tensors.push_back({t.name, safetensors_dtype(t.dtype), t.shape,
                       std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  io::testing::write_file(dir / "model.safetensors", io::testing::safetensors_bytes(tensors));
  return dir;
}

LoadedModel load(const fs::path& dir, const std::string& kv_dtype) {
  EngineConfig cfg;
  cfg.model_dir = dir.string();
  cfg.device = "cpu";
  cfg.kv_cache_dtype = kv_dtype;
  cfg.max_num_seqs = 4;
  cfg.cpu_kv_cache_bytes = 16 << 20;
  return load_model(cfg);
}

std::string prefix(int layer) {
  return "model.layers." + std::to_string(layer) + ".self_attn.";
}

struct Variant {
  const char* tag;
  std::vector<std::string> k_names, v_names;  // per layer 0..2 (empty: none)
};

TEST(KvCacheFp8, EveryNamingSchemeReachesItsLayer) {
  const std::vector<std::pair<std::string, std::pair<std::string, std::string>>> schemes = {
      {"modelopt", {"k_proj.k_scale", "v_proj.v_scale"}},
      {"qkv", {"qkv_proj.k_scale", "qkv_proj.v_scale"}},
      {"plain", {"k_scale", "v_scale"}},
      {"attn", {"attn.k_scale", "attn.v_scale"}},
      {"ct", {"k_proj.output_scale", "v_proj.output_scale"}},
  };
  for (const auto& [tag, names] : schemes) {
    std::vector<TensorSpec> extra;
    for (int l = 0; l < 3; ++l) {
      extra.push_back(scalar(prefix(l) + names.first, 0.5f + l));
      extra.push_back(scalar(prefix(l) + names.second, 0.25f + l));
    }
    LoadedModel m = load(fixture_with(tag, extra), "fp8");
    EXPECT_EQ(m.num_kv_scale_layers, 3) << tag;
    for (int l = 0; l < 3; ++l) {
      EXPECT_EQ(m.runner->kv_cache()[l].k_scale, 0.5f + l) << tag << " layer " << l;
      EXPECT_EQ(m.runner->kv_cache()[l].v_scale, 0.25f + l) << tag << " layer " << l;
    }
  }
}

TEST(KvCacheFp8, LegacyKvScaleAndPartialAndMissing) {
  // Layer 0: legacy kv_scale for both; layer 1: only k; layer 2: none (1.0).
  LoadedModel m = load(fixture_with("mixed", {scalar(prefix(0) + "kv_scale", 2.0f),
                                              scalar(prefix(1) + "k_proj.k_scale", 3.0f)}),
                       "fp8_e4m3");
  EXPECT_EQ(m.num_kv_scale_layers, 2);
  EXPECT_EQ(m.runner->kv_cache()[0].k_scale, 2.0f);
  EXPECT_EQ(m.runner->kv_cache()[0].v_scale, 2.0f);
  EXPECT_EQ(m.runner->kv_cache()[1].k_scale, 3.0f);
  EXPECT_EQ(m.runner->kv_cache()[1].v_scale, 3.0f);
  EXPECT_EQ(m.runner->kv_cache()[2].k_scale, 1.0f);
  EXPECT_EQ(m.runner->kv_cache()[2].v_scale, 1.0f);
}

TEST(KvCacheFp8, BadScaleTensorsNameThemselves) {
  try {
    load(fixture_with("unmapped", {scalar("model.layers.7.self_attn.k_scale", 1.0f)}), "fp8");
    FAIL() << "an unmappable scale must not load";
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.7.self_attn.k_scale"), std::string::npos)
        << e.what();
  }
  std::vector<uint8_t> two(8, 0);
  try {
    load(fixture_with("vector", {{prefix(0) + "v_scale", "F32", {2}, two}}), "fp8");
    FAIL() << "a non-scalar scale must not load";
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find(prefix(0) + "v_scale"), std::string::npos) << e.what();
  }
}

TEST(KvCacheFp8, UnknownDtypeListsTheChoices) {
  try {
    load(fixture_with("dtype", {}), "int4");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_e5m2"), std::string::npos) << e.what();
  }
}

// Last-position logits of a 40-token prompt (spans several blocks).
std::vector<float> prompt_logits(LoadedModel& m) {
  std::vector<int32_t> ids, blocks{0, 1, 2};
  for (int i = 0; i < 40; ++i) ids.push_back((37 * i + 11) % m.config.vocab_size);
  SeqChunk chunk{ids, 0, int(ids.size()), blocks, SeqChunk::Logits::kLast};
  return m.runner->execute({&chunk, 1});
}

TEST(KvCacheFp8, Fp8AttentionStaysCloseToF32) {
  fs::path dir = fixture_with("close", {});
  LoadedModel f32 = load(dir, "auto");
  LoadedModel e4m3 = load(dir, "fp8");
  LoadedModel e5m2 = load(dir, "fp8_e5m2");
  EXPECT_EQ(e4m3.kv_cache_dtype, "float8_e4m3fn");
  std::vector<float> want = prompt_logits(f32);
  // e4m3 keeps 3 mantissa bits (≤ 6.25 % rounding error per element), e5m2 2 bits (≤ 12.5 %);
  // the errors partly average out in the attention sums.
  EXPECT_LT(testing::rel_l2(prompt_logits(e4m3), want), 5e-2);
  EXPECT_LT(testing::rel_l2(prompt_logits(e5m2), want), 1e-1);
  // Scales are honoured: with k and v stored at 1/4 scale, results stay as close.
  LoadedModel scaled = load(
      fixture_with("scaled",
                   {scalar(prefix(0) + "k_scale", 0.25f), scalar(prefix(0) + "v_scale", 0.25f),
                    scalar(prefix(1) + "k_scale", 0.25f), scalar(prefix(1) + "v_scale", 0.25f),
                    scalar(prefix(2) + "k_scale", 0.25f), scalar(prefix(2) + "v_scale", 0.25f)}),
      "fp8");
  EXPECT_LT(testing::rel_l2(prompt_logits(scaled), want), 5e-2);
}

}  // namespace
}  // namespace serval::runtime
