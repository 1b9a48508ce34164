#include "io/model_config.h"

#include <gtest/gtest.h>

#include <cmath>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "support/expect_error.h"
#include "unit/io/safetensors_writer.h"

namespace serval::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TempDir;
using testing::write_file;

const std::string kBenchConfigs = SERVAL_SHARED_DIR "/bench-configs";

ModelConfig bench_config(const std::string& name) {
  std::string dir = kBenchConfigs + "/" + name;
  if (!fs::exists(dir + "/config.json")) throw std::runtime_error("missing " + dir);
  return load_model_config(dir);
}

bool have_bench_configs() {
  return fs::is_directory(kBenchConfigs);
}

using serval::testing::expect_load_error;

// A minimal Llama config; tests edit keys of it.
json llama_json() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", 1000},
              {"hidden_size", 64},
              {"intermediate_size", 128},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4}};
}

ModelConfig parse(const json& j) {
  return parse_model_config(j.dump(), "cfg/config.json");
}

TEST(ModelConfig, EveryBenchConfigParses) {
  if (!have_bench_configs()) GTEST_SKIP() << "no " << kBenchConfigs;
  int n = 0;
  for (const auto& e : fs::directory_iterator(kBenchConfigs)) {
    if (!fs::exists(e.path() / "config.json")) continue;
    SCOPED_TRACE(e.path().string());
    ModelConfig c = load_model_config(e.path().string());
    EXPECT_FALSE(c.architecture.empty());
    EXPECT_GT(c.num_parameters(), 500'000'000);
    EXPECT_EQ(c.num_attention_heads % c.num_key_value_heads, 0);
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(ModelConfig, Qwen3MoE30B) {
  if (!have_bench_configs()) GTEST_SKIP() << "no " << kBenchConfigs;
  for (const char* name : {"qwen3-30b-a3b", "qwen3-30b-a3b-nvfp4"}) {
    SCOPED_TRACE(name);
    ModelConfig c = bench_config(name);
    EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
    EXPECT_EQ(c.model_type, "qwen3_moe");
    EXPECT_EQ(c.vocab_size, 151936);
    EXPECT_EQ(c.hidden_size, 2048);
    EXPECT_EQ(c.num_hidden_layers, 48);
    EXPECT_EQ(c.num_attention_heads, 32);
    EXPECT_EQ(c.num_key_value_heads, 4);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.num_experts, 128);
    EXPECT_EQ(c.num_experts_per_tok, 8);
    EXPECT_EQ(c.moe_intermediate_size, 768);
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.rope_scaling.type, "default");
    EXPECT_EQ(c.rope_theta, 1e6f);
    EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
    EXPECT_EQ(c.max_position_embeddings, 40960);
    EXPECT_EQ(c.torch_dtype, DType::kBF16);
    EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151645});
    EXPECT_EQ(c.bos_token_id, 151643);
    for (int i = 0; i < 48; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;
    // Hand count: 2 x 151936 x 2048 (embed + lm_head) + 2048 (final norm) + 48 x (attention
    // 18874368 + q/k norm 256 + router 262144 + experts 603979776 + norms 4096); equals the
    // count Hugging Face reports for Qwen/Qwen3-30B-A3B.
    EXPECT_EQ(c.num_parameters(), 30'532'122'624);
  }
}

TEST(ModelConfig, Qwen3Dense06BTied) {
  if (!have_bench_configs()) GTEST_SKIP() << "no " << kBenchConfigs;
  ModelConfig c = bench_config("qwen3-0.6b");
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_EQ(c.head_dim, 128);  // explicit: differs from hidden / heads = 64
  EXPECT_EQ(c.intermediate_size, 3072);
  // 151936 x 1024 + 1024 + 28 x (q 2097152 + k 1048576 + v 1048576 + o 2097152 + 256
  // + mlp 9437184 + norms 2048).
  EXPECT_EQ(c.num_parameters(), 596'049'920);
}

TEST(ModelConfig, Llama33_70B) {
  if (!have_bench_configs()) GTEST_SKIP() << "no " << kBenchConfigs;
  for (const char* name : {"llama-3.3-70b", "llama-3.3-70b-nvfp4"}) {
    SCOPED_TRACE(name);
    ModelConfig c = bench_config(name);
    EXPECT_EQ(c.architecture, "LlamaForCausalLM");
    EXPECT_FALSE(c.qk_norm);
    EXPECT_EQ(c.num_key_value_heads, 8);
    EXPECT_EQ(c.rope_scaling.type, "llama3");
    EXPECT_EQ(c.rope_scaling.factor, 8.0f);
    EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
    EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
    EXPECT_EQ(c.rope_theta, 500000.0f);
    EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
    EXPECT_EQ(c.bos_token_id, 128000);
    // 2 x 128256 x 8192 + 8192 + 80 x (attention 150994944 + mlp 704643072 + norms 16384).
    EXPECT_EQ(c.num_parameters(), 70'553'706'496);
  }
}

TEST(ModelConfig, MixtralStyleKeys) {
  json j = {{"architectures", {"MixtralForCausalLM"}},
            {"model_type", "mixtral"},
            {"vocab_size", 32000},
            {"hidden_size", 4096},
            {"intermediate_size", 14336},
            {"num_hidden_layers", 32},
            {"num_attention_heads", 32},
            {"num_key_value_heads", 8},
            {"num_local_experts", 8},
            {"num_experts_per_tok", 2}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 14336);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 1e6f);  // MixtralConfig default
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.qk_norm);
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(c.is_moe_layer(i));
  EXPECT_EQ(c.num_parameters(), 46'702'792'704);  // Mixtral-8x7B's published count
}

TEST(ModelConfig, Qwen3MoeDefaultsAndSparseLayers) {
  json j = llama_json();
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  j["num_hidden_layers"] = 6;
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  ModelConfig c = parse(j);
  EXPECT_FALSE(c.norm_topk_prob);  // Qwen3MoeConfig default
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_EQ(c.num_key_value_heads, 4);  // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 16);            // 64 / 4
  EXPECT_EQ(c.max_position_embeddings, 32768);

  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  j["norm_topk_prob"] = true;
  c = parse(j);
  EXPECT_TRUE(c.norm_topk_prob);
  const bool want[] = {false, true, false, false, false, true};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.is_moe_layer(i), want[i]) << i;
  // embed 64000 + lm_head 64000 + final norm 64, per layer attention 16384 + qk norm 32 +
  // norms 128, MLP 3*64*128 = 24576 dense or 4*64 + 4*3*64*32 = 24832 MoE.
  const int64_t attn = 16384 + 32 + 128;
  EXPECT_EQ(c.num_parameters(), 128064 + 6 * attn + 4 * 24576 + 2 * 24832);
}

TEST(ModelConfig, BiasesAndDefaults) {
  json j = llama_json();
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  j["tie_word_embeddings"] = true;
  j["num_key_value_heads"] = 2;
  j["dtype"] = "float16";
  ModelConfig c = parse(j);
  EXPECT_EQ(c.torch_dtype, DType::kF16);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.bos_token_id.has_value());
  // Per layer: q 64*64+64, k 64*32+32, v 64*32+32, o 64*64+64, mlp 3*64*128 + 2*128 + 64,
  // norms 128; plus embed 64000 (tied) and final norm 64.
  const int64_t layer = (4096 + 64) + 2 * (2048 + 32) + (4096 + 64) + (24576 + 320) + 128;
  EXPECT_EQ(c.num_parameters(), 64000 + 64 + 2 * layer);
}

// Qwen2: biases on q, k and v whatever the config says (its config has no attention_bias key),
// none on o; Qwen2Config's context default.
TEST(ModelConfig, Qwen2HasQkvBiases) {
  json j = llama_json();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["model_type"] = "qwen2";
  j["num_key_value_heads"] = 2;
  j["tie_word_embeddings"] = true;
  const ModelConfig c = parse(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  // Per layer: q 64*64+64, k 64*32+32, v 64*32+32, o 64*64, mlp 3*64*128, norms 128.
  const int64_t layer = (4096 + 64) + 2 * (2048 + 32) + 4096 + 24576 + 128;
  EXPECT_EQ(c.num_parameters(), 64000 + 64 + 2 * layer);
  EXPECT_FALSE(parse(llama_json()).qkv_bias);
}

// Qwen2-MoE: Qwen2's q/k/v biases (unless its qkv_bias says otherwise), experts not
// renormalized, and a shared expert of shared_expert_intermediate_size with a one-row gate.
TEST(ModelConfig, Qwen2MoeSharedExpert) {
  json j = llama_json();
  j["architectures"] = {"Qwen2MoeForCausalLM"};
  j["model_type"] = "qwen2_moe";
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 16;
  j["shared_expert_intermediate_size"] = 32;
  j["tie_word_embeddings"] = true;
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_expert_intermediate_size, 32);
  // Per layer: attention 4 · 64² + 3 · 64 biases, router 4 · 64, experts 4 · 3 · 64 · 16,
  // shared expert 3 · 64 · 32 and its gate 64, norms 128.
  const int64_t layer = 4 * 4096 + 3 * 64 + 256 + 12288 + 6144 + 64 + 128;
  EXPECT_EQ(c.num_parameters(), 64000 + 64 + 2 * layer);
  j["qkv_bias"] = false;
  EXPECT_FALSE(parse(j).qkv_bias);
  j.erase("shared_expert_intermediate_size");
  EXPECT_EQ(parse(j).shared_expert_intermediate_size, 5632);  // Qwen2MoeConfig's default
}

// DeepSeek-V3's config.json as published: multi-head latent attention (head_dim becomes the
// rotary width), 3 dense layers then MoE layers of 256 routed experts in 8 groups with sigmoid
// scores (noaux_tc) and one shared expert, DeepSeek's YaRN. 671B parameters (the checkpoint's
// 685B include the 14B of the multi-token-prediction layer, which serval does not load).
json deepseek_v3_json() {
  return json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"model_type", "deepseek_v3"},
              {"vocab_size", 129280},
              {"hidden_size", 7168},
              {"intermediate_size", 18432},
              {"moe_intermediate_size", 2048},
              {"num_hidden_layers", 61},
              {"num_attention_heads", 128},
              {"num_key_value_heads", 128},
              {"n_shared_experts", 1},
              {"n_routed_experts", 256},
              {"routed_scaling_factor", 2.5},
              {"kv_lora_rank", 512},
              {"q_lora_rank", 1536},
              {"qk_rope_head_dim", 64},
              {"v_head_dim", 128},
              {"qk_nope_head_dim", 128},
              {"topk_method", "noaux_tc"},
              {"n_group", 8},
              {"topk_group", 4},
              {"num_experts_per_tok", 8},
              {"moe_layer_freq", 1},
              {"first_k_dense_replace", 3},
              {"norm_topk_prob", true},
              {"scoring_func", "sigmoid"},
              {"max_position_embeddings", 163840},
              {"rope_scaling",
               {{"beta_fast", 32},
                {"beta_slow", 1},
                {"factor", 40},
                {"mscale", 1.0},
                {"mscale_all_dim", 1.0},
                {"original_max_position_embeddings", 4096},
                {"type", "yarn"}}},
              {"rope_theta", 10000},
              {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", false}};
}

TEST(ModelConfig, DeepseekV3) {
  const ModelConfig c = parse(deepseek_v3_json());
  ASSERT_TRUE(c.is_mla());
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 128);
  EXPECT_EQ(c.mla.v_head_dim, 128);
  EXPECT_TRUE(c.mla.rope_interleave);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(60));
  EXPECT_EQ(c.shared_expert_intermediate_size, 2048);
  EXPECT_TRUE(c.moe_sigmoid_grouped);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  const float mscale = 0.1f * std::log(40.0f) + 1.0f;  // yarn_get_mscale(40, 1.0)
  EXPECT_FLOAT_EQ(c.rope_scaling.mla_softmax_factor, mscale * mscale);
  EXPECT_FLOAT_EQ(c.rope_scaling.attention_factor, 1.0f);  // mscale / mscale_all_dim
  EXPECT_NEAR(double(c.num_parameters()), 671e9, 1e9);
}

// DeepSeek-V2-Lite: q without the bottleneck (q_lora_rank null), softmax greedy routing of 64
// experts, two shared experts; 15.7B parameters. group_limited_greedy is refused unless it keeps
// every group (then it is greedy).
TEST(ModelConfig, DeepseekV2LiteAndRoutingChoices) {
  json j = deepseek_v3_json();
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  j["model_type"] = "deepseek_v2";
  j["vocab_size"] = 102400;
  j["hidden_size"] = 2048;
  j["intermediate_size"] = 10944;
  j["moe_intermediate_size"] = 1408;
  j["num_hidden_layers"] = 27;
  j["num_attention_heads"] = 16;
  j["num_key_value_heads"] = 16;
  j["n_shared_experts"] = 2;
  j["n_routed_experts"] = 64;
  j["num_experts_per_tok"] = 6;
  j["routed_scaling_factor"] = 1.0;
  j["q_lora_rank"] = nullptr;
  j["topk_method"] = "greedy";
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["first_k_dense_replace"] = 1;
  j["norm_topk_prob"] = false;
  j.erase("scoring_func");
  j["rope_scaling"]["factor"] = 40;
  j["rope_scaling"]["mscale"] = 0.707;
  j["rope_scaling"]["mscale_all_dim"] = 0.707;
  ModelConfig c = parse(j);
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_TRUE(c.mla.rope_interleave);
  EXPECT_FALSE(c.moe_sigmoid_grouped);
  EXPECT_EQ(c.shared_expert_intermediate_size, 2 * 1408);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_NEAR(double(c.num_parameters()), 15.7e9, 0.2e9);
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 8;
  j["topk_group"] = 8;
  EXPECT_FALSE(parse(j).moe_sigmoid_grouped);  // every group kept: greedy
  j["topk_group"] = 3;
  expect_load_error([&] { parse(j); }, {"topk_method", "group_limited_greedy", "not supported"});
  j["topk_group"] = 9;
  expect_load_error([&] { parse(j); }, {"topk_group", "must not exceed n_group"});
}

// Phi-3: fused qkv_proj and gate_up_proj; RoPE on part of the heads (Phi-3.5, Phi-4-mini) and
// LongRoPE are refused by name.
TEST(ModelConfig, Phi3FusedProjections) {
  json j = llama_json();
  j["architectures"] = {"Phi3ForCausalLM"};
  j["model_type"] = "phi3";
  EXPECT_TRUE(parse(j).fused_projections);
  EXPECT_FALSE(parse(llama_json()).fused_projections);
  j["partial_rotary_factor"] = 1.0;
  EXPECT_TRUE(parse(j).fused_projections);
  j["partial_rotary_factor"] = 0.75;
  expect_load_error([&] { parse(j); }, {"'partial_rotary_factor'", "0.75"});
  j.erase("partial_rotary_factor");
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
  expect_load_error([&] { parse(j); }, {"'rope_scaling.rope_type'", "longrope"});
}

TEST(ModelConfig, RopeVariants) {
  json j = llama_json();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse(j).rope_scaling.type, "linear");
  EXPECT_EQ(parse(j).rope_scaling.factor, 2.0f);

  // transformers 5: rope_parameters carries rope_theta and the type.
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 32.0},          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 2.0}, {"original_max_position_embeddings", 8192}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, "default");
  EXPECT_EQ(c.rope_theta, 1e6f);
}

// YaRN as transformers reads it: the original context (default max_position_embeddings), the
// factor (default their ratio), betas, and the attention factor 0.1·ln(factor) + 1 unless given
// or derived from mscale / mscale_all_dim.
TEST(ModelConfig, YarnRope) {
  json j = llama_json();
  j["max_position_embeddings"] = 32768;
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  RopeScaling s = parse(j).rope_scaling;
  EXPECT_EQ(s.type, "yarn");
  EXPECT_EQ(s.factor, 4.0f);
  EXPECT_EQ(s.original_max_position_embeddings, 32768);
  EXPECT_EQ(s.beta_fast, 32.0f);
  EXPECT_EQ(s.beta_slow, 1.0f);
  EXPECT_TRUE(s.truncate);
  EXPECT_NEAR(s.attention_factor, 0.1 * std::log(4.0) + 1, 1e-6);
  j["rope_scaling"] = {{"type", "yarn"},  {"original_max_position_embeddings", 4096},
                       {"mscale", 1.0},   {"mscale_all_dim", 1.0},
                       {"beta_fast", 16}, {"truncate", false}};
  s = parse(j).rope_scaling;
  EXPECT_EQ(s.factor, 8.0f);  // 32768 / 4096
  EXPECT_EQ(s.attention_factor, 1.0f);
  EXPECT_EQ(s.beta_fast, 16.0f);
  EXPECT_FALSE(s.truncate);
  j["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_EQ(parse(j).rope_scaling.attention_factor, 1.5f);
  EXPECT_EQ(parse(llama_json()).rope_scaling.attention_factor, 1.0f);
}

TEST(ModelConfig, ErrorsNameFileAndKey) {
  auto expect_bad = [](json j, std::vector<std::string> needles) {
    needles.push_back("cfg/config.json");
    expect_load_error([&] { parse(j); }, needles);
  };
  json j = llama_json();
  j.erase("vocab_size");
  expect_bad(j, {"'vocab_size'", "missing"});
  j = llama_json();
  j.erase("architectures");
  expect_bad(j, {"'architectures'", "missing"});
  j = llama_json();
  j["architectures"] = json::array();
  expect_bad(j, {"'architectures'"});
  j = llama_json();
  j["num_hidden_layers"] = 1000000000;  // walked layer by layer before any tensor is read
  expect_bad(j, {"'num_hidden_layers'", "at most 65536", "1000000000"});
  j = llama_json();
  j["num_hidden_layers"] = 65536;
  EXPECT_EQ(parse(j).num_hidden_layers, 65536);
  j = llama_json();
  j["num_local_experts"] = 100000;
  j["num_experts_per_tok"] = 2;
  expect_bad(j, {"'num_local_experts'", "at most 65536"});
  j = llama_json();
  j["hidden_size"] = "64";
  expect_bad(j, {"'hidden_size'", "integer", "string"});
  j = llama_json();
  j["hidden_size"] = 64.5;
  expect_bad(j, {"'hidden_size'", "integer"});
  j = llama_json();
  j["num_hidden_layers"] = 0;
  expect_bad(j, {"'num_hidden_layers'"});
  j = llama_json();
  j["vocab_size"] = 1e12;
  expect_bad(j, {"'vocab_size'"});
  j = llama_json();  // every size in range, the product not: 2^61 parameters wrapped int64
  j["hidden_size"] = 1 << 30;
  j["intermediate_size"] = 1 << 30;
  j["num_hidden_layers"] = 4096;
  expect_bad(j, {"parameters", "more than 2^46", "hidden_size 1073741824"});
  j = llama_json();
  j["num_key_value_heads"] = 3;
  expect_bad(j, {"'num_key_value_heads'", "divide"});
  j = llama_json();
  j["rms_norm_eps"] = "x";
  expect_bad(j, {"'rms_norm_eps'", "number"});
  j = llama_json();
  j["tie_word_embeddings"] = 1;
  expect_bad(j, {"'tie_word_embeddings'", "boolean"});
  j = llama_json();
  j["torch_dtype"] = "float8";
  expect_bad(j, {"'torch_dtype'", "float8"});
  j = llama_json();
  j["eos_token_id"] = {1, "2"};
  expect_bad(j, {"'eos_token_id'"});
  j = llama_json();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  expect_bad(j, {"'rope_scaling.rope_type'", "dynamic"});
  j = llama_json();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", -4.0}};
  expect_bad(j, {"'rope_scaling.factor'", "> 0"});
  j = llama_json();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", "8"}};
  expect_bad(j, {"'rope_scaling.factor'", "number"});
  j = llama_json();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_bad(j, {"'rope_scaling.low_freq_factor'", "missing"});
  j = llama_json();
  j["rope_scaling"] = "llama3";
  expect_bad(j, {"rope_scaling", "object"});
  j = llama_json();
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 5;
  expect_bad(j, {"'num_experts_per_tok'"});
  j = llama_json();
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["mlp_only_layers"] = {7};
  expect_bad(j, {"'mlp_only_layers'", "7"});
  expect_load_error([] { parse_model_config("{\"vocab_size\": ", "cfg/config.json"); },
                    {"cfg/config.json", "invalid JSON"});
  expect_load_error([] { parse_model_config("[]", "cfg/config.json"); },
                    {"cfg/config.json", "object"});
}

TEST(ModelConfig, LoadFromFolder) {
  TempDir dir;
  expect_load_error([&] { load_model_config(dir.str()); }, {"config.json", dir.str()});
  write_file(dir / "config.json", llama_json().dump());
  EXPECT_EQ(load_model_config(dir.str()).vocab_size, 1000);
}

// sliding_window: a window when set (and not switched off by use_sliding_window), else 0;
// MistralForCausalLM reads as Llama's keys.
TEST(ModelConfig, SlidingWindowAndMistral) {
  json j = llama_json();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  EXPECT_EQ(parse(j).sliding_window, 0);
  EXPECT_EQ(parse(j).max_position_embeddings, 4096 * 32);
  j["sliding_window"] = 4096;
  EXPECT_EQ(parse(j).sliding_window, 4096);
  j["use_sliding_window"] = false;
  EXPECT_EQ(parse(j).sliding_window, 0);
  j.erase("use_sliding_window");
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse(j).sliding_window, 0);
  j["sliding_window"] = 0;
  expect_load_error([&] { parse(j); }, {"cfg/config.json", "'sliding_window'"});
}

// --hf-overrides: a JSON merge patch over config.json (nested objects merge, null removes).
TEST(ModelConfig, HfOverridesPatchTheConfig) {
  TempDir dir;
  json j = llama_json();
  j["max_position_embeddings"] = 4096;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 2.0},
                       {"original_max_position_embeddings", 8192}};
  write_file(dir / "config.json", j.dump());
  const ModelConfig patched = load_model_config(
      dir.str(), R"({"max_position_embeddings": 65536, "rope_scaling": {"factor": 16.0}})");
  EXPECT_EQ(patched.max_position_embeddings, 65536);
  EXPECT_EQ(patched.rope_scaling.factor, 16.0f);
  EXPECT_EQ(patched.rope_scaling.high_freq_factor, 2.0f);  // kept: the objects merged
  EXPECT_EQ(load_model_config(dir.str(), R"({"rope_scaling": null})").rope_scaling.type, "default");
  EXPECT_EQ(load_model_config(dir.str()).max_position_embeddings, 4096);
  expect_load_error([&] { load_model_config(dir.str(), "[1]"); }, {"--hf-overrides", "object"});
  expect_load_error([&] { load_model_config(dir.str(), "{"); }, {"--hf-overrides"});
  expect_load_error([&] { load_model_config(dir.str(), R"({"hidden_size": "big"})"); },
                    {"--hf-overrides", "hidden_size"});
}

TEST(GenerationConfig, LoadsSamplingDefaults) {
  TempDir dir;
  GenerationConfig empty = load_generation_config(dir.str());
  EXPECT_FALSE(empty.temperature || empty.top_p || empty.top_k || empty.min_p);
  EXPECT_TRUE(empty.eos_token_ids.empty());

  write_file(dir / "generation_config.json",
             std::string(R"({"bos_token_id": 1, "do_sample": true, "eos_token_id": [151645, 151643],
                 "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                 "transformers_version": "4.51.0"})"));
  GenerationConfig g = load_generation_config(dir.str());
  EXPECT_FLOAT_EQ(*g.temperature, 0.6f);
  EXPECT_FLOAT_EQ(*g.top_p, 0.95f);
  EXPECT_EQ(*g.top_k, 20);
  EXPECT_FALSE(g.min_p.has_value());
  EXPECT_FALSE(g.repetition_penalty.has_value());
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{151645, 151643}));

  write_file(dir / "generation_config.json", std::string(R"({"eos_token_id": 2, "min_p": 0.1,
                 "repetition_penalty": 1.1, "temperature": null})"));
  g = load_generation_config(dir.str());
  EXPECT_FALSE(g.temperature.has_value());
  EXPECT_FLOAT_EQ(*g.min_p, 0.1f);
  EXPECT_FLOAT_EQ(*g.repetition_penalty, 1.1f);
  EXPECT_EQ(g.eos_token_ids, std::vector<int32_t>{2});

  const std::string path = (dir / "generation_config.json").string();
  write_file(path, std::string(R"({"top_k": "20"})"));
  expect_load_error([&] { load_generation_config(dir.str()); }, {path, "'top_k'"});
  for (const char* bad : {R"({"top_p": 5})", R"({"top_p": 0})", R"({"min_p": 1.5})",
                          R"({"repetition_penalty": 0})", R"({"temperature": -1})"}) {
    write_file(path, std::string(bad));
    expect_load_error([&] { load_generation_config(dir.str()); }, {path, "must be in"});
  }
  write_file(path, std::string(R"({"temperature": 0.6,)"));
  expect_load_error([&] { load_generation_config(dir.str()); }, {path, "invalid JSON"});
}

// --override-generation-config: the same keys and ranges; anything else is refused by name.
TEST(GenerationConfig, OverrideTakesTheSamplingKeysOnly) {
  const GenerationConfig g = parse_generation_config_override(
      R"({"temperature": 0.2, "top_k": 5, "min_p": 0.05, "max_new_tokens": 64})");
  EXPECT_EQ(*g.max_new_tokens, 64);
  EXPECT_FLOAT_EQ(*g.temperature, 0.2f);
  EXPECT_EQ(*g.top_k, 5);
  EXPECT_FLOAT_EQ(*g.min_p, 0.05f);
  EXPECT_FALSE(g.top_p.has_value());
  EXPECT_TRUE(parse_generation_config_override("{}").eos_token_ids.empty());
  const std::string flag = "--override-generation-config";
  expect_load_error([&] { parse_generation_config_override(R"({"max_tokens": 5})"); },
                    {flag, "unknown key 'max_tokens'", "temperature, top_p"});
  expect_load_error([&] { parse_generation_config_override(R"({"top_p": 2})"); },
                    {flag, "must be in"});
  expect_load_error([&] { parse_generation_config_override(R"({"max_new_tokens": 0})"); },
                    {flag, "'max_new_tokens'", "must be in"});
  expect_load_error([&] { parse_generation_config_override("[1]"); }, {flag, "JSON object"});
  expect_load_error([&] { parse_generation_config_override("{"); }, {flag, "invalid JSON"});
}

}  // namespace
}  // namespace serval::io
