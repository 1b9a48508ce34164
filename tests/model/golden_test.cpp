// The CPU engine against Hugging Face transformers' golden outputs (tools/make_fixtures.py):
// logits within 1e-3 relative (fp32 math), identical greedy tokens, for every architecture,
// single and batched, with and without prefix reuse. The same for the quantized fixtures
// (tools/make_quant_fixtures.py: NVFP4 and FP8 checkpoints in ModelOpt, compressed-tensors and
// block layouts, against transformers on the dequantized weights), whose k/v scales must also
// load for every layer.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "base/error.h"
#include "io/model_config.h"
#include "model/model.h"
#include "quant/kv_scales.h"
#include "runtime/model_runner.h"
#include "support/compare.h"

namespace serval {
namespace {

using testing::rel_l2;

constexpr int kBlockSize = 4;  // small, so prompts span several blocks
constexpr int kNumBlocks = 512;

struct GoldenPrompt {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;  // [len][vocab]
  std::vector<int32_t> greedy;
  std::vector<double> margins;  // reference top-1 minus top-2 logit at each greedy step
  // W4A4 only: positions from here on depend on fp32 noise (a quantized input element within
  // FRAGILE_MARGIN · row RMS of a bf16 rounding midpoint whose other side changes its NVFP4 value;
  // tools/make_quant_fixtures.py). ids.size() when the golden has no such field.
  size_t fragile_from = 0;
};

std::string fixture_dir(const std::string& name) {
  return std::string(SERVAL_SOURCE_DIR) + "/tests/fixtures/" + name;
}

std::vector<GoldenPrompt> load_golden(const std::string& dir,
                                      const std::string& file = "golden.json") {
  std::ifstream f(dir + "/" + file);
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<GoldenPrompt> out;
  for (const auto& p : j["prompts"]) {
    out.push_back(
        {p["ids"].get<std::vector<int32_t>>(), p["logits"].get<std::vector<std::vector<float>>>(),
         p["greedy"].get<std::vector<int32_t>>(), p["greedy_margins"].get<std::vector<double>>()});
    out.back().fragile_from = p.value("fragile_from", out.back().ids.size());
  }
  return out;
}

// w4a4: --nvfp4-activations (NVFP4 linears quantize their inputs).
std::unique_ptr<runtime::ModelRunner> make_runner(const std::string& dir, bool w4a4 = false) {
  io::ModelConfig config = io::load_model_config(dir);
  auto backend = backend::make_cpu_backend();
  auto weights = model::open_checkpoint_weights(dir);
  if (w4a4) weights->enable_nvfp4_activations();
  auto m = model::create_model(config, *weights, *backend, {});
  return std::make_unique<runtime::ModelRunner>(std::move(backend), std::move(m), kNumBlocks,
                                                kBlockSize);
}

// Sequences decoded together; each owns a disjoint range of blocks.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int computed = 0;
};

int argmax(const float* row, int n) {
  return int(std::max_element(row, row + n) - row);
}

// Greedy-decodes every sequence `steps` tokens in lockstep; prefill of all prompts in step 0.
void greedy_batch(runtime::ModelRunner& runner, std::vector<Seq>& seqs, int steps, int vocab) {
  for (int step = 0; step < steps; ++step) {
    std::vector<runtime::SeqChunk> chunks;
    for (Seq& s : seqs) {
      chunks.push_back({s.tokens, s.computed, int(s.tokens.size()) - s.computed, s.blocks,
                        runtime::SeqChunk::Logits::kLast});
    }
    std::vector<float> logits = runner.execute(chunks);
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].computed = int(seqs[i].tokens.size());
      seqs[i].tokens.push_back(argmax(&logits[i * vocab], vocab));
    }
  }
}

// The quantized fixtures are made on a machine with PyTorch (tools/make_quant_fixtures.py); a
// checkout without them skips their cases with that instruction.
bool fixture_missing(const std::string& dir) {
  return !std::filesystem::exists(dir + "/golden.json");
}
constexpr const char* kMakeQuantFixtures =
    "not generated yet: run tools/make_quant_fixtures.py --fixtures tests/fixtures where torch "
    "and transformers are installed";

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (fixture_missing(fixture_dir(GetParam())))
      GTEST_SKIP() << GetParam() << ": " << kMakeQuantFixtures;
  }
};

// The model of `dir` scores every golden prompt of `golden_dir` as transformers did.
void expect_prompt_logits(const std::string& dir, const std::string& golden_dir) {
  auto runner = make_runner(dir);
  const int vocab = runner->model().config().vocab_size;
  auto golden = load_golden(golden_dir);
  int next_block = 0;
  for (const GoldenPrompt& p : golden) {
    std::vector<int32_t> blocks;
    for (size_t i = 0; i < (p.ids.size() + kBlockSize - 1) / kBlockSize; ++i)
      blocks.push_back(next_block++);
    runtime::SeqChunk chunk{p.ids, 0, int(p.ids.size()), blocks, runtime::SeqChunk::Logits::kAll};
    std::vector<float> logits = runner->execute({&chunk, 1});
    for (size_t t = 0; t < p.ids.size(); ++t) {
      EXPECT_LT(rel_l2({&logits[t * vocab], size_t(vocab)}, p.logits[t]), 1e-3)
          << dir << " position " << t;
    }
  }
}

TEST_P(Golden, PromptLogitsMatchTransformers) {
  expect_prompt_logits(fixture_dir(GetParam()), fixture_dir(GetParam()));
}

// MistralForCausalLM without a sliding window is transformers' Llama decoder under another name
// (its modeling file is Llama's, generated from it): the llama fixture's weights and config,
// renamed, must give the llama golden logits.
TEST(GoldenAliases, MistralIsLlamaWithoutAWindow) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("serval_mistral_golden_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(fixture_dir("llama"), dir);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  config["architectures"] = {"MistralForCausalLM"};
  config["model_type"] = "mistral";
  config["sliding_window"] = nullptr;
  std::ofstream(dir / "config.json", std::ios::trunc) << config.dump();
  ASSERT_EQ(io::load_model_config(dir.string()).architecture, "MistralForCausalLM");
  expect_prompt_logits(dir.string(), fixture_dir("llama"));
  std::filesystem::remove_all(dir);
}

// Config settings the layers do not compute are refused at load, with the key, not ignored.
TEST(GoldenAliases, UnsupportedMlpSettingsAreRefused) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("serval_mlp_refused_" + std::to_string(getpid()));
  const nlohmann::json original =
      nlohmann::json::parse(std::ifstream(fixture_dir("llama") + "/config.json"));
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"mlp_bias", true}, {"hidden_act", "gelu_pytorch_tanh"}}) {
    std::filesystem::remove_all(dir);
    std::filesystem::copy(fixture_dir("llama"), dir);
    nlohmann::json config = original;
    config[key] = value;
    std::ofstream(dir / "config.json", std::ios::trunc) << config.dump();
    try {
      make_runner(dir.string());
      ADD_FAILURE() << "loaded a model with " << key << " = " << value;
    } catch (const LoadError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_P(Golden, GreedyTokensMatchSingleAndBatched) {
  const std::string dir = fixture_dir(GetParam());
  auto golden = load_golden(dir);
  for (int batch : {1, 3, 8}) {
    auto runner = make_runner(dir);
    const int vocab = runner->model().config().vocab_size;
    std::vector<Seq> seqs;
    int next_block = 0;
    for (int i = 0; i < batch; ++i) {
      Seq s;
      s.tokens = golden[i % golden.size()].ids;
      for (int b = 0; b < (int(s.tokens.size()) + 32 + kBlockSize - 1) / kBlockSize; ++b)
        s.blocks.push_back(next_block++);
      seqs.push_back(std::move(s));
    }
    greedy_batch(*runner, seqs, 32, vocab);
    for (int i = 0; i < batch; ++i) {
      const GoldenPrompt& g = golden[i % golden.size()];
      std::vector<int32_t> got(seqs[i].tokens.begin() + g.ids.size(), seqs[i].tokens.end());
      // Tokens must match up to the first near-tie of the reference (margin < 1e-3, where fp32
      // summation order may legitimately pick the other token), and entirely if there is none.
      size_t n = 0;
      while (n < g.greedy.size() && g.margins[n] >= 1e-3) ++n;
      if (n < g.greedy.size()) GTEST_LOG_(INFO) << GetParam() << ": reference near-tie at " << n;
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + n),
                std::vector<int32_t>(g.greedy.begin(), g.greedy.begin() + n))
          << GetParam() << " batch " << batch << " seq " << i;
    }
  }
}

TEST_P(Golden, PrefixReuseGivesSameLogits) {
  // Compute a prompt in two chunks (the first as if served from a prefix cache) and compare
  // the last logits with a one-shot prefill.
  const std::string dir = fixture_dir(GetParam());
  auto golden = load_golden(dir);
  const GoldenPrompt& p = golden[2];  // 17 tokens
  auto runner = make_runner(dir);
  const int vocab = runner->model().config().vocab_size;
  std::vector<int32_t> blocks{0, 1, 2, 3, 4};
  runtime::SeqChunk first{p.ids, 0, 8, blocks, runtime::SeqChunk::Logits::kNone};
  runner->execute({&first, 1});
  runtime::SeqChunk rest{p.ids, 8, int(p.ids.size()) - 8, blocks, runtime::SeqChunk::Logits::kLast};
  std::vector<float> logits = runner->execute({&rest, 1});
  EXPECT_LT(rel_l2({logits.data(), size_t(vocab)}, p.logits.back()), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Archs, Golden,
                         ::testing::Values("llama", "qwen3", "qwen3_moe", "mixtral", "qwen2",
                                           "qwen2_moe", "qwen3_yarn", "llama_bias", "phi3",
                                           "deepseek_v3", "deepseek_v2"));
INSTANTIATE_TEST_SUITE_P(Quantized, Golden,
                         ::testing::Values("llama_nvfp4_modelopt", "qwen3_moe_nvfp4_ct",
                                           "llama_fp8_modelopt", "qwen3_moe_fp8_block",
                                           "deepseek_v3_fp8_block"));

// W4A4: the NVFP4 ModelOpt fixture run with --nvfp4-activations against transformers with every
// quantized linear's input rounded through NVFP4 (tools/make_quant_fixtures.py, SPEC 2.2). Each
// prompt is compared up to its fragile_from position: from there the reference hinges on an input
// element within fp32 noise of a bf16 rounding midpoint, which either side may legitimately round
// the other way (the W4A4 analogue of the greedy near-ties above).
TEST(GoldenW4A4, Nvfp4ActivationsMatchTheReference) {
  const std::string dir = fixture_dir("llama_nvfp4_modelopt");
  if (!std::filesystem::exists(dir + "/golden_w4a4.json"))
    GTEST_SKIP() << "llama_nvfp4_modelopt: " << kMakeQuantFixtures;
  auto runner = make_runner(dir, true);
  const int vocab = runner->model().config().vocab_size;
  const auto golden = load_golden(dir, "golden_w4a4.json");
  const auto w4a16 = load_golden(dir);
  int next_block = 0;
  double max_w4a16_gap = 0;
  size_t checked = 0, total = 0;
  for (size_t g = 0; g < golden.size(); ++g) {
    const GoldenPrompt& p = golden[g];
    std::vector<int32_t> blocks;
    for (size_t i = 0; i < (p.ids.size() + kBlockSize - 1) / kBlockSize; ++i)
      blocks.push_back(next_block++);
    runtime::SeqChunk chunk{p.ids, 0, int(p.ids.size()), blocks, runtime::SeqChunk::Logits::kAll};
    std::vector<float> logits = runner->execute({&chunk, 1});
    // A flip at a fragile position reaches every later one through attention: compare before it.
    const size_t n = std::min(p.fragile_from, p.ids.size());
    if (n < p.ids.size())
      GTEST_LOG_(INFO) << "prompt " << g << ": reference fragile from position " << n << " of "
                       << p.ids.size();
    for (size_t t = 0; t < n; ++t) {
      EXPECT_LT(rel_l2({&logits[t * vocab], size_t(vocab)}, p.logits[t]), 1e-3)
          << "prompt " << g << " position " << t;
      max_w4a16_gap = std::max(max_w4a16_gap, rel_l2(p.logits[t], w4a16[g].logits[t]));
    }
    checked += n;
    total += p.ids.size();
  }
  // Most positions must be comparable, and the activation quantization must matter on them, or
  // this test could not tell the paths apart.
  EXPECT_GE(2 * checked, total) << "only " << checked << " of " << total << " positions compared";
  EXPECT_GT(max_w4a16_gap, 1e-2);
}

// Every quantized fixture stores random k/v scales in [0.5, 2] for every layer, each fixture
// under another of SPEC 3's names.
class QuantizedKvScales : public Golden {};

TEST_P(QuantizedKvScales, LoadForEveryLayer) {
  const std::string dir = fixture_dir(GetParam());
  const io::ModelConfig config = io::load_model_config(dir);
  auto weights = model::open_checkpoint_weights(dir);
  quant::KvScaleOptions options;
  options.num_layers = config.num_hidden_layers;
  const quant::KvScales scales =
      quant::load_kv_scales(weights->names(), options,
                            [&](const std::string& name) { return weights->get_stored(name); });
  EXPECT_EQ(scales.num_loaded_layers, config.num_hidden_layers);
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    EXPECT_GE(scales.k[i], 0.5f) << "layer " << i;
    EXPECT_LE(scales.k[i], 2.0f) << "layer " << i;
    EXPECT_GE(scales.v[i], 0.5f) << "layer " << i;
    EXPECT_LE(scales.v[i], 2.0f) << "layer " << i;
    EXPECT_NE(scales.k[i], scales.v[i]) << "layer " << i << ": k and v come from distinct tensors";
  }
}

INSTANTIATE_TEST_SUITE_P(Quantized, QuantizedKvScales,
                         ::testing::Values("llama_nvfp4_modelopt", "qwen3_moe_nvfp4_ct",
                                           "llama_fp8_modelopt", "qwen3_moe_fp8_block"));

}  // namespace
}  // namespace serval
