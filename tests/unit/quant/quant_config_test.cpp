// Parsing of hf_quant_config.json / config.json quantization descriptions.
#include "quant/quant_config.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "base/error.h"
#include "support/expect_error.h"

namespace serval::quant {
namespace {

using Method = QuantConfig::Method;

using serval::testing::expect_load_error;

QuantConfig hf(const std::string& text) {
  return parse_hf_quant_config(text, "/m/hf_quant_config.json");
}
QuantConfig cfg(const std::string& text) {
  return parse_config_json_quantization(text, "/m/config.json");
}

std::string shared(const std::string& rel) {
  return std::string(SERVAL_SHARED_DIR) + "/" + rel;
}

TEST(QuantConfig, Qwen3MoeNvfp4BenchConfig) {
  QuantConfig c = load_quant_config(shared("bench-configs/qwen3-30b-a3b-nvfp4"));
  EXPECT_EQ(c.method, Method::kNvfp4);
  EXPECT_EQ(c.group_size, 16);
  EXPECT_TRUE(c.kv_cache_fp8);
  EXPECT_TRUE(c.static_activations);
  EXPECT_FALSE(c.reciprocal_global_scales);
  EXPECT_TRUE(c.source.ends_with("qwen3-30b-a3b-nvfp4/hf_quant_config.json")) << c.source;
  EXPECT_EQ(c.exclude_globs, (std::vector<std::string>{"lm_head", "model.layers.*.mlp.gate"}));
  EXPECT_FALSE(is_quantized(c, "lm_head"));
  EXPECT_FALSE(is_quantized(c, "model.layers.0.mlp.gate"));
  EXPECT_FALSE(is_quantized(c, "model.layers.47.mlp.gate"));
  EXPECT_TRUE(is_quantized(c, "model.layers.47.mlp.experts.127.gate_proj"));
  EXPECT_TRUE(is_quantized(c, "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(is_quantized(c, "model.layers.0.self_attn.o_proj"));
}

TEST(QuantConfig, Llama70bNvfp4BenchConfig) {
  QuantConfig c = load_quant_config(shared("bench-configs/llama-3.3-70b-nvfp4"));
  EXPECT_EQ(c.method, Method::kNvfp4);
  EXPECT_TRUE(c.kv_cache_fp8);
  EXPECT_EQ(c.exclude_globs, std::vector<std::string>{"lm_head"});
  EXPECT_FALSE(is_quantized(c, "lm_head"));
  EXPECT_TRUE(is_quantized(c, "model.layers.79.mlp.gate_proj"));
  EXPECT_TRUE(is_quantized(c, "model.layers.79.mlp.down_proj"));
}

TEST(QuantConfig, UnquantizedBenchConfig) {
  QuantConfig c = load_quant_config(shared("bench-configs/qwen3-0.6b"));
  EXPECT_EQ(c.method, Method::kNone);
  EXPECT_TRUE(c.source.empty());
  EXPECT_FALSE(c.kv_cache_fp8);
  EXPECT_FALSE(is_quantized(c, "model.layers.0.self_attn.q_proj"));
}

TEST(QuantConfig, ModelOptVariants) {
  QuantConfig fp8 = hf(R"({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": null}})");
  EXPECT_EQ(fp8.method, Method::kFp8PerTensor);
  EXPECT_TRUE(fp8.static_activations);
  EXPECT_FALSE(fp8.kv_cache_fp8);
  EXPECT_EQ(fp8.source, "/m/hf_quant_config.json");

  QuantConfig pc = hf(R"({"quantization": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}})");
  EXPECT_EQ(pc.method, Method::kFp8PerChannel);
  EXPECT_FALSE(pc.static_activations);

  QuantConfig pb = hf(R"({"quantization": {"quant_algo": "FP8_PB_WO"}})");
  EXPECT_EQ(pb.method, Method::kFp8Block);
  EXPECT_EQ(pb.block_size, (std::array<int, 2>{128, 128}));
  EXPECT_TRUE(pb.weight_only);
  EXPECT_EQ(pb.block_scale_name, "weight_scale");

  // Keys at the top level, and KV-only quantization.
  QuantConfig flat = hf(R"({"quant_algo": null, "kv_cache_quant_algo": "FP8"})");
  EXPECT_EQ(flat.method, Method::kNone);
  EXPECT_TRUE(flat.kv_cache_fp8);
}

TEST(QuantConfig, ConfigJsonModelOpt) {
  QuantConfig nested = cfg(R"({"quantization_config": {"quant_method": "modelopt",
      "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "FP8",
                       "exclude_modules": ["lm_head"]}}})");
  EXPECT_EQ(nested.method, Method::kNvfp4);
  EXPECT_TRUE(nested.kv_cache_fp8);
  EXPECT_EQ(nested.source, "/m/config.json");
  QuantConfig flat = cfg(R"({"quantization_config": {"quant_method": "modelopt",
      "quant_algo": "NVFP4", "ignore": ["lm_head", "model.layers.?.mlp.gate"]}})");
  EXPECT_EQ(flat.method, Method::kNvfp4);
  EXPECT_FALSE(flat.kv_cache_fp8);
  EXPECT_FALSE(is_quantized(flat, "model.layers.3.mlp.gate"));
  EXPECT_TRUE(is_quantized(flat, "model.layers.13.mlp.gate"));  // '?' is one character
  EXPECT_EQ(cfg(R"({"hidden_size": 8})").method, Method::kNone);
}

TEST(QuantConfig, CompressedTensorsNvfp4) {
  QuantConfig c = cfg(R"({"quantization_config": {
    "config_groups": {"group_0": {
      "input_activations": {"dynamic": "local", "group_size": 16, "num_bits": 4,
                            "strategy": "tensor_group", "symmetric": true, "type": "float"},
      "output_activations": null, "targets": ["Linear"],
      "weights": {"dynamic": false, "group_size": 16, "num_bits": 4, "strategy": "tensor_group",
                  "symmetric": true, "type": "float", "block_structure": null}}},
    "format": "nvfp4-pack-quantized", "ignore": ["lm_head", "re:.*mlp.gate$"],
    "kv_cache_scheme": null, "quant_method": "compressed-tensors",
    "quantization_status": "compressed"}})");
  EXPECT_EQ(c.method, Method::kNvfp4);
  EXPECT_EQ(c.group_size, 16);
  EXPECT_TRUE(c.reciprocal_global_scales);
  EXPECT_TRUE(c.static_activations);
  EXPECT_FALSE(c.weight_only);
  EXPECT_FALSE(c.kv_cache_fp8);
  EXPECT_EQ(c.exclude_names, std::vector<std::string>{"lm_head"});
  EXPECT_EQ(c.exclude_regexes, std::vector<std::string>{".*mlp.gate$"});
  EXPECT_FALSE(is_quantized(c, "lm_head"));
  EXPECT_FALSE(is_quantized(c, "model.layers.5.mlp.gate"));
  EXPECT_TRUE(is_quantized(c, "model.layers.5.mlp.gate_proj"));
  EXPECT_TRUE(is_quantized(c, "model.layers.5.mlp.experts.0.up_proj"));
}

TEST(QuantConfig, CompressedTensorsFp8Variants) {
  auto parse = [](const std::string& weights, const std::string& acts, const std::string& extra) {
    return cfg(R"({"quantization_config": {"quant_method": "compressed-tensors",
        "format": "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": )" +
               weights + R"(, "input_activations": )" + acts + "}}" + extra + "}}");
  };
  QuantConfig ch =
      parse(R"({"num_bits": 8, "type": "float", "strategy": "channel"})",
            R"({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true})",
            R"(, "kv_cache_scheme": {"num_bits": 8, "type": "float"})");
  EXPECT_EQ(ch.method, Method::kFp8PerChannel);
  EXPECT_FALSE(ch.static_activations);
  EXPECT_TRUE(ch.kv_cache_fp8);
  EXPECT_FALSE(ch.reciprocal_global_scales);

  QuantConfig t =
      parse(R"({"num_bits": 8, "type": "float", "strategy": "tensor"})",
            R"({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false})", "");
  EXPECT_EQ(t.method, Method::kFp8PerTensor);
  EXPECT_TRUE(t.static_activations);

  QuantConfig b = parse(
      R"({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 64]})",
      R"({"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": true})",
      "");
  EXPECT_EQ(b.method, Method::kFp8Block);
  EXPECT_EQ(b.block_size, (std::array<int, 2>{128, 64}));
  EXPECT_EQ(b.block_scale_name, "weight_scale");

  QuantConfig wo = parse(R"({"num_bits": 8, "type": "float", "strategy": "channel"})", "null", "");
  EXPECT_TRUE(wo.weight_only);
  EXPECT_FALSE(wo.static_activations);
}

TEST(QuantConfig, CompressedTensorsTargetsRestrictQuantizedModules) {
  QuantConfig c = cfg(R"({"quantization_config": {"quant_method": "compressed-tensors",
      "config_groups": {"g": {"targets": ["re:.*mlp\\.experts\\..*", "model.layers.0.self_attn.o_proj"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}})");
  EXPECT_TRUE(is_quantized(c, "model.layers.2.mlp.experts.3.down_proj"));
  EXPECT_TRUE(is_quantized(c, "model.layers.0.self_attn.o_proj"));
  EXPECT_FALSE(is_quantized(c, "model.layers.1.self_attn.o_proj"));
  EXPECT_FALSE(is_quantized(c, "lm_head"));
}

TEST(QuantConfig, Fp8Method) {
  QuantConfig ds = cfg(R"({"quantization_config": {"quant_method": "fp8",
      "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}})");
  EXPECT_EQ(ds.method, Method::kFp8Block);
  EXPECT_EQ(ds.block_size, (std::array<int, 2>{128, 128}));
  EXPECT_EQ(ds.block_scale_name, "weight_scale_inv");
  EXPECT_FALSE(ds.static_activations);
  QuantConfig st = cfg(R"({"quantization_config": {"quant_method": "fp8",
      "activation_scheme": "static", "ignored_layers": ["lm_head", "model.layers.0.mlp.gate"]}})");
  EXPECT_EQ(st.method, Method::kFp8PerTensor);
  EXPECT_TRUE(st.static_activations);
  EXPECT_FALSE(is_quantized(st, "model.layers.0.mlp.gate"));
  EXPECT_TRUE(is_quantized(st, "model.layers.1.mlp.gate"));  // exact names, not globs
}

// serve --quantization: vLLM's name of each format is accepted (and "modelopt" for ModelOpt
// NVFP4, as vLLM does); another format's name, or any name for an unquantized checkpoint, is
// refused with both names.
TEST(QuantConfig, RequestedQuantizationMustMatchTheCheckpoint) {
  const QuantConfig nvfp4 = hf(R"({"quantization": {"quant_algo": "NVFP4"}})");
  const QuantConfig mo_fp8 = hf(R"({"quantization": {"quant_algo": "FP8"}})");
  const QuantConfig fp8 = cfg(R"({"quantization_config": {"quant_method": "fp8"}})");
  const QuantConfig ct = cfg(R"({"quantization_config": {"quant_method": "compressed-tensors",
      "config_groups": {"g": {"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}})");
  EXPECT_EQ(nvfp4.vllm_name, "modelopt_fp4");
  EXPECT_EQ(mo_fp8.vllm_name, "modelopt");
  EXPECT_EQ(fp8.vllm_name, "fp8");
  EXPECT_EQ(ct.vllm_name, "compressed-tensors");
  const QuantConfig none;
  EXPECT_EQ(none.vllm_name, "");
  for (const QuantConfig* c : {&nvfp4, &mo_fp8, &fp8, &ct, &none}) {
    EXPECT_NO_THROW(check_requested_quantization(*c, ""));
    if (!c->vllm_name.empty()) EXPECT_NO_THROW(check_requested_quantization(*c, c->vllm_name));
  }
  EXPECT_NO_THROW(check_requested_quantization(nvfp4, "modelopt"));
  auto expect_refused = [](const QuantConfig& c, const char* requested,
                           std::vector<std::string> parts) {
    try {
      check_requested_quantization(c, requested);
      ADD_FAILURE() << requested << " accepted for '" << c.vllm_name << "'";
    } catch (const InvalidArgument& e) {
      for (const std::string& part : parts)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_refused(mo_fp8, "modelopt_fp4", {"modelopt_fp4", "'modelopt'", "hf_quant_config.json"});
  expect_refused(fp8, "compressed-tensors", {"compressed-tensors", "'fp8'", "config.json"});
  expect_refused(none, "fp8", {"--quantization fp8", "not quantized"});
}

TEST(QuantConfig, MalformedNamesFileAndKey) {
  const std::string h = "/m/hf_quant_config.json", c = "/m/config.json";
  expect_load_error([] { hf(R"({"quantization": {"quant_algo": "INT8_SQ"}})"); },
                    {h, "quantization.quant_algo", "INT8_SQ"});
  expect_load_error([] { hf(R"({"quantization": {"quant_algo": "NVFP4", "group_size": 32}})"); },
                    {h, "quantization.group_size", "32"});
  expect_load_error(
      [] { hf(R"({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "INT8"}})"); },
      {h, "quantization.kv_cache_quant_algo", "INT8"});
  expect_load_error(
      [] { hf(R"({"quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}})"); },
      {h, "quantization.exclude_modules"});
  expect_load_error([] { hf(R"({"quantization": {"quant_algo": 4}})"); },
                    {h, "quantization.quant_algo", "string"});
  expect_load_error([] { hf(R"({"quantization": )"); }, {h, "invalid JSON"});
  expect_load_error([] { hf(R"({"producer": {}})"); }, {h, "quantization"});
  expect_load_error([] { cfg(R"({"quantization_config": {"quant_method": "gptq"}})"); },
                    {c, "quantization_config.quant_method", "gptq"});
  expect_load_error([] { cfg(R"({"quantization_config": {"bits": 4}})"); },
                    {c, "quantization_config.quant_method", "missing"});
  expect_load_error(
      [] {
        cfg(R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}})");
      },
      {c, "quantization_config.weight_block_size"});
  expect_load_error(
      [] { cfg(R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "x"}})"); },
      {c, "quantization_config.activation_scheme"});
  expect_load_error(
      [] {
        cfg(R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
            "weight_block_size": [128, 128]}})");
      },
      {c, "quantization_config.activation_scheme"});
}

TEST(QuantConfig, MalformedCompressedTensors) {
  const std::string c = "/m/config.json";
  auto ct = [](const std::string& body) {
    cfg(R"({"quantization_config": {"quant_method": "compressed-tensors", )" + body + "}}");
  };
  const std::string fp8w = R"({"num_bits": 8, "type": "float", "strategy": "tensor"})";
  expect_load_error(
      [&] {
        ct(R"("config_groups": {"group_0": {"targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}})");
      },
      {c, "quantization_config.config_groups.group_0.weights.num_bits", "int"});
  expect_load_error(
      [&] {
        ct(R"("config_groups": {"a": {"targets": ["Linear"], "weights": )" + fp8w +
           R"(}, "b": {"targets": ["re:.*experts.*"], "weights": {"num_bits": 8,
            "type": "float", "strategy": "channel"}}})");
      },
      {c, "quantization_config.config_groups.b", "different scheme"});
  expect_load_error(
      [&] {
        ct(R"("config_groups": {"g": {"targets": ["Linear"], "weights": )" + fp8w +
           R"(}}, "ignore": ["re:(unclosed"])");
      },
      {c, "quantization_config.ignore", "(unclosed"});
  expect_load_error(
      [&] {
        ct(R"("config_groups": {"g": {"targets": ["Linear"], "weights": )" + fp8w +
           R"(}}, "format": "pack-quantized")");
      },
      {c, "quantization_config.format", "pack-quantized"});
  expect_load_error(
      [&] {
        ct(R"("config_groups": {"g": {"targets": ["Linear"], "weights": )" + fp8w +
           R"(}}, "kv_cache_scheme": {"num_bits": 4, "type": "int"})");
      },
      {c, "quantization_config.kv_cache_scheme.num_bits"});
  expect_load_error([&] { ct(R"("config_groups": {})"); },
                    {c, "quantization_config.config_groups", "no groups"});
  expect_load_error(
      [&] {
        ct(R"("config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8,
            "type": "float", "strategy": "block"}}})");
      },
      {c, "quantization_config.config_groups.g.weights.block_structure", "missing"});
}

TEST(QuantConfig, LoadPrefersHfQuantConfig) {
  auto dir =
      std::filesystem::temp_directory_path() / ("serval_quant_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  write("config.json", R"({"quantization_config": {"quant_method": "fp8"}})");
  EXPECT_EQ(load_quant_config(dir.string()).method, Method::kFp8PerTensor);
  EXPECT_EQ(load_quant_config(dir.string()).source, (dir / "config.json").string());
  write("hf_quant_config.json", R"({"quantization": {"quant_algo": "NVFP4"}})");
  QuantConfig c = load_quant_config(dir.string());
  EXPECT_EQ(c.method, Method::kNvfp4);
  EXPECT_EQ(c.source, (dir / "hf_quant_config.json").string());
  EXPECT_NE(describe(c).find("nvfp4"), std::string::npos);
  write("hf_quant_config.json", R"({"quantization": {"quant_algo": "W4A8_AWQ"}})");
  expect_load_error([&] { load_quant_config(dir.string()); },
                    {(dir / "hf_quant_config.json").string(), "W4A8_AWQ"});
  std::filesystem::remove_all(dir);
  EXPECT_EQ(load_quant_config(dir.string()).method, Method::kNone);
}

}  // namespace
}  // namespace serval::quant
