// Quantized layouts that have no golden fixture yet, end to end on the CUDA backend: the CPU
// backend loads dummy weights (--load-format dummy) and computes the reference logits; every
// tensor it read is written to a checkpoint, which the CUDA backend loads, so both hold the same
// values (a backend that generates dummy weights on its device keys quantized stacks by their
// fused names, so its values would differ) and the GPU takes the checkpoint path of real models.
// A prompt of 6 tokens, then 3 decode steps fed the CPU's greedy tokens.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
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

// Dummy weights that remember every tensor a load reads from them.
class RecordingDummyWeights : public model::WeightSource {
 public:
  explicit RecordingDummyWeights(const quant::QuantConfig& quant)
      : dummy_(model::make_dummy_weights(DType::kBF16, 7, quant)) {
    quant_ = quant;
  }
  bool has(const std::string& name) const override { return dummy_->has(name); }
  bool is_dummy() const override { return true; }
  Tensor get(const std::string& name, const Shape& shape) const override {
    return record(name, dummy_->get(name, shape));
  }
  Tensor get_expected(const quant::ExpectedTensor& e) const override {
    return record(e.name, dummy_->get_expected(e));
  }
  // Every tensor read so far, as a safetensors file.
  std::vector<uint8_t> checkpoint() const {
    std::vector<io::testing::TensorSpec> specs;
    for (const auto& [name, t] : read_) {
      const auto* bytes = static_cast<const uint8_t*>(t.data);
      specs.push_back({name, io::testing::safetensors_dtype(t.dtype), t.shape,
                       std::vector<uint8_t>(bytes, bytes + t.nbytes())});
    }
    return io::testing::safetensors_bytes(specs);
  }

 private:
  Tensor record(const std::string& name, Tensor t) const {
    read_.insert_or_assign(name, t);
    return t;
  }
  std::unique_ptr<model::WeightSource> dummy_;
  mutable std::map<std::string, Tensor> read_;
};

std::unique_ptr<runtime::ModelRunner> make_runner(const io::ModelConfig& config,
                                                  const model::WeightSource& weights,
                                                  std::unique_ptr<backend::Backend> b) {
  auto m = model::create_model(config, weights, *b, {});
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
  const io::ModelConfig config = io::load_model_config(tmp.str());
  RecordingDummyWeights dummy(quant::load_quant_config(tmp.str()));
  auto cpu = make_runner(config, dummy, backend::make_cpu_backend());
  io::testing::write_file(tmp.path() / "model.safetensors", dummy.checkpoint());
  auto gpu =
      make_runner(config, *model::open_checkpoint_weights(tmp.str()), backend::make_cuda_backend());
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
