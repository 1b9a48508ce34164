// Dummy quantized weights (--load-format dummy) on the NVFP4 bench configuration, shortened to
// two layers: the dequantized linears have the intended spread, and a CPU forward gives finite
// logits. Also: the weight-memory estimate counts NVFP4 linears at 0.5625 bytes per weight.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "io/model_config.h"
#include "kernels/cpu/quant_linear.h"
#include "model/model.h"
#include "model/quantized_weight.h"
#include "runtime/model_runner.h"
#include "support/dummy_configs.h"
#include "unit/io/safetensors_writer.h"

namespace serval {
namespace {

namespace fs = std::filesystem;

const std::string kBench = std::string(SERVAL_SHARED_DIR) + "/bench-configs/qwen3-30b-a3b-nvfp4";

// The bench config with `layers` layers in a temp folder.
void write_short_config(const fs::path& dir, int layers) {
  nlohmann::json c = nlohmann::json::parse(std::ifstream(kBench + "/config.json"));
  c["num_hidden_layers"] = layers;
  io::testing::write_file(dir / "config.json", c.dump(2));
  fs::copy_file(kBench + "/hf_quant_config.json", dir / "hf_quant_config.json");
}

TEST(QuantizedDummy, Nvfp4WeightsHaveStdNear002) {
  if (!fs::exists(kBench)) GTEST_SKIP() << kBench << " not found";
  const quant::QuantConfig q = quant::load_quant_config(kBench);
  ASSERT_EQ(q.method, quant::QuantConfig::Method::kNvfp4);
  auto w = model::make_dummy_weights(DType::kBF16, 7, q);
  // q/k/v fused (2048 + 2 · 512 rows of 2048) and one expert's down projection.
  for (auto shards :
       {std::vector<model::LinearShard>{{"model.layers.0.self_attn.q_proj", 4096},
                                        {"model.layers.0.self_attn.k_proj", 512},
                                        {"model.layers.0.self_attn.v_proj", 512}},
        std::vector<model::LinearShard>{{"model.layers.0.mlp.experts.3.down_proj", 2048}}}) {
    const int64_t k = shards[0].module.ends_with("down_proj") ? 768 : 2048;
    backend::Weight weight = model::read_linear(*w, shards, k);
    ASSERT_TRUE(weight.quantized()) << shards[0].module;
    const backend::QuantizedWeight& qw = *weight.q;
    kernels::QuantLinearParams p{};
    p.format = qw.format;
    p.w = qw.data.as<const uint8_t>();
    p.scales = qw.scales.data;
    p.global_scale = qw.global_scale[0];
    p.n = qw.n;
    p.k = qw.k;
    std::vector<float> row(size_t(qw.k));
    double sum = 0, sq = 0;
    int64_t count = 0;
    for (int r = 0; r < qw.n; r += 7) {
      kernels::cpu::dequant_weight_row(p, r, row.data());
      for (float v : row) sum += v, sq += double(v) * v, ++count;
    }
    const double mean = sum / count, std = std::sqrt(sq / count - mean * mean);
    EXPECT_NEAR(std, 0.02, 0.002) << shards[0].module;
    EXPECT_NEAR(mean, 0.0, 0.001) << shards[0].module;
  }
}

TEST(QuantizedDummy, WeightBytesCountNvfp4AtStorageSize) {
  if (!fs::exists(kBench)) GTEST_SKIP() << kBench << " not found";
  const io::ModelConfig c = io::load_model_config(kBench);
  const quant::QuantConfig q = quant::load_quant_config(kBench);
  const int64_t bytes = model::model_weight_bytes(c, q, DType::kBF16);
  // By hand: embeddings + lm_head bf16; per layer the attention and expert linears at 0.5625
  // B/weight plus 8 bytes of global/input scales each, router and norms bf16.
  const int64_t H = 2048, V = 151936, E = 128, I = 768, L = 48;
  const int64_t attn = (4096 + 512 + 512) * H + H * 4096;
  const int64_t per_layer =
      attn * 9 / 16 + 4 * 8 + E * (3 * H * I * 9 / 16 + 3 * 8) + 2 * (E * H + 2 * 128 + 2 * H);
  EXPECT_EQ(bytes, 2 * (2 * V * H + H) + L * per_layer);
  // Unquantized: every parameter in bf16.
  EXPECT_EQ(model::model_weight_bytes(c, quant::QuantConfig{}, DType::kBF16),
            2 * c.num_parameters());
}

TEST(QuantizedDummy, TwoLayerBenchModelRunsOnCpuWithFiniteLogits) {
  if (!fs::exists(kBench)) GTEST_SKIP() << kBench << " not found";
  io::testing::TempDir tmp;
  write_short_config(tmp.path(), 2);
  const io::ModelConfig config = io::load_model_config(tmp.str());
  auto weights = model::make_dummy_weights(DType::kBF16, 3, quant::load_quant_config(tmp.str()));
  auto backend = backend::make_cpu_backend();
  auto m = model::create_model(config, *weights, *backend, {});
  runtime::ModelRunner runner(std::move(backend), std::move(m), 8, 16);
  const std::vector<int32_t> prompt = {9707, 11, 1879, 0, 151643};
  const std::vector<int32_t> blocks = {0};
  runtime::SeqChunk chunk{prompt, 0, int(prompt.size()), blocks, runtime::SeqChunk::Logits::kAll};
  std::vector<float> logits = runner.execute({&chunk, 1});
  ASSERT_EQ(logits.size(), prompt.size() * size_t(config.vocab_size));
  double sq = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    sq += double(v) * v;
  }
  EXPECT_GT(sq, 0.0);  // not all zeros
}

// DeepSeek-V3's layout and FP8 block quantization_config (support/dummy_configs.h): every linear
// quantized, kv_b_proj too (MlaAttention dequantizes it on the host to fold
// it into the queries and the output), a dense layer then an MoE layer. A CPU forward gives finite
// logits, also after a decode step over the latent cache rows.
TEST(QuantizedDummy, DeepseekFp8BlockRunsOnCpu) {
  io::testing::TempDir tmp;
  const nlohmann::json c = testing::deepseek_v3_fp8_dummy_config();
  io::testing::write_file(tmp.path() / "config.json", c.dump(2));
  const io::ModelConfig config = io::load_model_config(tmp.str());
  const quant::QuantConfig q = quant::load_quant_config(tmp.str());
  ASSERT_EQ(q.method, quant::QuantConfig::Method::kFp8Block);
  EXPECT_LT(model::model_weight_bytes(config, q, DType::kBF16), 2 * config.num_parameters());
  auto weights = model::make_dummy_weights(DType::kBF16, 5, q);
  auto backend = backend::make_cpu_backend();
  auto m = model::create_model(config, *weights, *backend, {});
  EXPECT_FALSE(m->kv_geometry().values);
  EXPECT_EQ(m->kv_geometry().head_dim, 128 + 64);
  runtime::ModelRunner runner(std::move(backend), std::move(m), 8, 16);
  const std::vector<int32_t> prompt = {9, 11, 187, 0, 15, 300};
  const std::vector<int32_t> blocks = {0};
  for (const auto& [start, count] : {std::pair{0, 5}, std::pair{5, 1}}) {  // prefill, decode
    runtime::SeqChunk chunk{prompt, start, count, blocks, runtime::SeqChunk::Logits::kAll};
    std::vector<float> logits = runner.execute({&chunk, 1});
    ASSERT_EQ(logits.size(), size_t(count) * size_t(config.vocab_size));
    double sq = 0;
    for (float v : logits) {
      ASSERT_TRUE(std::isfinite(v));
      sq += double(v) * v;
    }
    EXPECT_GT(sq, 0.0);  // not all zeros
  }
}

}  // namespace
}  // namespace serval
