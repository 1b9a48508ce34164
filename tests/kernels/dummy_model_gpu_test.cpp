// Quantized layouts that have no golden fixture yet, end to end on the CUDA backend with dummy
// weights (--load-format dummy): both backends make the same dummy weights bit for bit
// (dummy_init_test.cpp), so the CPU backend's logits are the oracle. A prompt of 6 tokens, then
// 3 decode steps fed the CPU's greedy tokens.
//   DeepSeek-V3's FP8 checkpoint layout (128 × 128 blocks, no ignored layers): MLA on FP8
//   linears with kv_b_proj dequantized on the host, a dense layer, then FP8 block routed experts
//   with a shared expert and sigmoid grouped routing.
//   Qwen3-MoE with ModelOpt FP8 (per-tensor scales) and with block FP8 experts.
// Tolerance as model_gpu_test.cpp (bf16 activations against fp32: 3e-2 relative L2 per logits
// row); MoE routing is discontinuous, so one row in ten may exceed it (a near-tie router logit
// picking another expert) but the median row must sit well inside it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "kernels/gpu_test_support.h"
#include "model/model.h"
#include "model/quantized_weight.h"
#include "quant/quant_config.h"
#include "runtime/model_runner.h"
#include "support/compare.h"
#include "support/dummy_configs.h"
#include "unit/io/safetensors_writer.h"

namespace serval {
namespace {

constexpr double kLogitsRelTol = 3e-2;
constexpr int kBlockSize = 16;

nlohmann::json qwen3_moe() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", 512},
          {"hidden_size", 256},
          {"intermediate_size", 512},
          {"moe_intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 64},
          {"num_experts", 8},
          {"num_experts_per_tok", 2},
          {"norm_topk_prob", true},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0}};
}

struct Case {
  const char* name;
  nlohmann::json config;
  nlohmann::json hf_quant_config;  // null: none (the config's quantization_config, if any)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

std::unique_ptr<runtime::ModelRunner> make_runner(const std::string& dir, bool gpu) {
  const io::ModelConfig config = io::load_model_config(dir);
  auto weights = model::make_dummy_weights(DType::kBF16, 7, quant::load_quant_config(dir));
  auto b = gpu ? backend::make_cuda_backend() : backend::make_cpu_backend();
  auto m = model::create_model(config, *weights, *b, {});
  return std::make_unique<runtime::ModelRunner>(std::move(b), std::move(m), 64, kBlockSize);
}

class DummyModelGpu : public ::testing::TestWithParam<Case> {};

TEST_P(DummyModelGpu, LogitsMatchCpu) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const Case& c = GetParam();
  io::testing::TempDir tmp;
  io::testing::write_file(tmp.path() / "config.json", c.config.dump(2));
  if (!c.hf_quant_config.is_null())
    io::testing::write_file(tmp.path() / "hf_quant_config.json", c.hf_quant_config.dump(2));
  auto cpu = make_runner(tmp.str(), false);
  auto gpu = make_runner(tmp.str(), true);
  const int vocab = cpu->model().config().vocab_size;
  std::vector<int32_t> tokens = {9, 11, 187, 0, 15, 300};
  const std::vector<int32_t> blocks = {0};
  std::vector<double> errors;
  int computed = 0;
  for (int step = 0; step < 4; ++step) {  // the prefill, then 3 decode steps
    const int count = int(tokens.size()) - computed;
    const runtime::SeqChunk chunk{tokens, computed, count, blocks, runtime::SeqChunk::Logits::kAll};
    const std::vector<float> want = cpu->execute({&chunk, 1}), got = gpu->execute({&chunk, 1});
    ASSERT_EQ(want.size(), size_t(count) * vocab);
    ASSERT_EQ(got.size(), want.size());
    for (int t = 0; t < count; ++t)
      errors.push_back(testing::rel_l2({&got[size_t(t) * vocab], size_t(vocab)},
                                       {&want[size_t(t) * vocab], size_t(vocab)}));
    computed = int(tokens.size());
    const float* last = &want[size_t(count - 1) * vocab];
    tokens.push_back(int32_t(std::max_element(last, last + vocab) - last));
  }
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  const size_t within = size_t(
      std::count_if(errors.begin(), errors.end(), [](double e) { return e < kLogitsRelTol; }));
  EXPECT_GE(within * 10, errors.size() * 9) << c.name << ": rows within tolerance";
  EXPECT_LT(sorted[sorted.size() / 2], kLogitsRelTol / 3) << c.name << ": median row";
  for (size_t i = 0; i < errors.size(); ++i)
    EXPECT_TRUE(std::isfinite(errors[i])) << c.name << " row " << i;
}

Case qwen3_fp8_block() {
  nlohmann::json c = qwen3_moe();
  c["quantization_config"] = {{"activation_scheme", "dynamic"},
                              {"fmt", "e4m3"},
                              {"quant_method", "fp8"},
                              {"weight_block_size", {128, 128}}};
  return {"Qwen3MoeFp8Block", c, nullptr};
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DummyModelGpu,
    ::testing::Values(
        Case{"DeepseekV3Fp8Block", testing::deepseek_v3_fp8_dummy_config(), nullptr},
        qwen3_fp8_block(),
        Case{"Qwen3MoeModelOptFp8", qwen3_moe(), {{"quantization", {{"quant_algo", "FP8"}}}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace serval
