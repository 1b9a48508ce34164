// The CUDA backend end to end on the golden fixtures: logits within bf16 tolerance of the
// transformers reference (fp32); and in batches that mix prefill and decode, logits rows within
// bf16 tolerance of the CPU engine's and greedy tokens equal to the CPU's wherever the CPU's
// top-1/top-2 margin exceeds twice the row's largest GPU−CPU difference (below that, a flip is a
// bf16 near-tie, and the two runs continue from different text).
// Dense models must keep every row within tolerance. In MoE models top-k routing is
// discontinuous: a bf16-sized change of a router logit can pick another expert for one token,
// which moves that row (and, through its KV entries, a few later ones) far beyond bf16 noise. On
// the H200 this hit 2-3 % of rows in batch 64 of the random-weight MoE fixtures, and on the H100
// 2 of the 56 golden prompt positions of the DeepSeek-V3 fixture (sigmoid grouped routing); so in
// every test here, for MoE models at least 90 % of rows must be within tolerance and the median
// row well inside it, which a broken kernel (errors on most rows) cannot pass.
// Block FP8 checkpoints: the CUDA FP8 kernels apply each block scale as a bf16 multiplier (a
// relative error up to 2^-9 per block, the same sign for the whole block). On the CPU alone,
// rounding the block scales so moves the logits of qwen3_moe_fp8_block by a median 0.42 % (max
// 0.65 %) and of deepseek_v3_fp8_block by 0.70 % (90th percentile 1.08 %, one routing flip at
// 15.7 %) against transformers; on top of bf16 activations the median bound is 2e-2 there.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/gpu_test_support.h"
#include "model/model.h"
#include "quant/quant_config.h"
#include "runtime/model_runner.h"
#include "support/compare.h"

namespace serval {
namespace {

constexpr int kBlockSize = 16;
// bf16 weights and activations against an fp32 reference: relative L2 of a logits row.
constexpr double kLogitsRelTol = 3e-2;
// "demo" is the trained demo model (confident logits: most greedy steps have clear margins);
// the others are the random-weight golden fixtures.
std::string fixture_dir(const std::string& name) {
  if (name == "demo") return std::string(SERVAL_SOURCE_DIR) + "/models/demo";
  return std::string(SERVAL_SOURCE_DIR) + "/tests/fixtures/" + name;
}

std::unique_ptr<runtime::ModelRunner> make_runner(const std::string& dir, bool gpu,
                                                  bool pooling = false) {
  io::ModelConfig config = io::load_model_config(dir);
  auto b = gpu ? backend::make_cuda_backend() : backend::make_cpu_backend();
  auto weights = model::open_checkpoint_weights(dir);
  model::LoadOptions options;
  options.pooling = pooling;
  auto m = model::create_model(config, *weights, *b, options);
  return std::make_unique<runtime::ModelRunner>(std::move(b), std::move(m), 1024, kBlockSize);
}

// How a fixture's rows are judged (see above).
struct RowRule {
  bool moe = false;
  double median_bound = kLogitsRelTol / 3;
};

RowRule row_rule(runtime::ModelRunner& runner, const std::string& dir) {
  RowRule rule;
  rule.moe = runner.model().config().num_experts > 0;
  if (quant::load_quant_config(dir).method == quant::QuantConfig::Method::kFp8Block)
    rule.median_bound = 2e-2;
  return rule;
}

// The rule above over rows' relative L2 errors (`what` names the rows in failure messages).
void expect_rows_within_tolerance(std::vector<double> errors, const RowRule& rule,
                                  const std::string& what) {
  ASSERT_FALSE(errors.empty()) << what;
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_TRUE(std::isfinite(errors[i])) << what << " row " << i;
    if (!rule.moe) {
      EXPECT_LT(errors[i], kLogitsRelTol) << what << " row " << i;
    }
  }
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2], p90 = errors[errors.size() * 9 / 10];
  const std::string spread = ": median " + std::to_string(median) + ", 90th percentile " +
                             std::to_string(p90) + ", max " + std::to_string(errors.back()) +
                             " of " + std::to_string(errors.size()) + " rows";
  EXPECT_LT(p90, kLogitsRelTol) << what << spread;
  EXPECT_LT(median, rule.median_bound) << what << spread;
}

class GpuModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuModel, PromptLogitsMatchTransformers) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::string dir = fixture_dir(GetParam());
  std::ifstream f(dir + "/golden.json");
  if (!f) GTEST_SKIP() << dir << " has no golden.json";
  nlohmann::json golden = nlohmann::json::parse(f);
  auto runner = make_runner(dir, true);
  const int vocab = runner->model().config().vocab_size;
  int next_block = 0;
  std::vector<double> errors;
  for (const auto& p : golden["prompts"]) {
    auto ids = p["ids"].get<std::vector<int32_t>>();
    auto want = p["logits"].get<std::vector<std::vector<float>>>();
    std::vector<int32_t> blocks;
    for (size_t i = 0; i < (ids.size() + kBlockSize - 1) / kBlockSize; ++i)
      blocks.push_back(next_block++);
    runtime::SeqChunk chunk{ids, 0, int(ids.size()), blocks, runtime::SeqChunk::Logits::kAll};
    std::vector<float> logits = runner->execute({&chunk, 1});
    for (size_t t = 0; t < ids.size(); ++t)
      errors.push_back(testing::rel_l2({&logits[t * vocab], want[t].size()}, want[t]));
  }
  expect_rows_within_tolerance(errors, row_rule(*runner, dir), GetParam() + " prompt logits");
}

// --runner pooling: the final hidden states of every prompt position (fp32 out of bf16) within
// bf16 tolerance of the CPU's.
TEST_P(GpuModel, PoolingHiddenStatesMatchCpu) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::string dir = fixture_dir(GetParam());
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not generated yet";
  auto cpu = make_runner(dir, false, true);
  auto gpu = make_runner(dir, true, true);
  const int hidden = cpu->model().config().hidden_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 21; ++i) ids.push_back((37 * i + 11) % cpu->model().config().vocab_size);
  const std::vector<int32_t> blocks = {0, 1};
  const runtime::SeqChunk chunk{ids, 0, int(ids.size()), blocks, runtime::SeqChunk::Logits::kAll};
  const std::vector<float> want = cpu->execute({&chunk, 1}), got = gpu->execute({&chunk, 1});
  ASSERT_EQ(want.size(), ids.size() * size_t(hidden));
  ASSERT_EQ(got.size(), want.size());
  std::vector<double> errors;
  for (size_t t = 0; t < ids.size(); ++t)
    errors.push_back(
        testing::rel_l2({&got[t * hidden], size_t(hidden)}, {&want[t * hidden], size_t(hidden)}));
  expect_rows_within_tolerance(errors, row_rule(*cpu, dir), GetParam() + " hidden states");
}

// Sequence i has a prompt of 3 + 5·(i mod 12) tokens and joins the batch at step i, so every
// step mixes decodes with a prefill; 24 decode steps each.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  std::vector<std::vector<float>> rows;  // the logits row of each generated token
  int computed = 0;
  int prompt_len = 0;
};

std::vector<Seq> run_staggered(runtime::ModelRunner& runner, int batch, int vocab) {
  std::vector<Seq> seqs(batch);
  for (int i = 0; i < batch; ++i) {
    seqs[i].prompt_len = 3 + 5 * (i % 12);
    for (int t = 0; t < seqs[i].prompt_len; ++t) seqs[i].tokens.push_back((7 * i + 13 * t) % vocab);
    for (int b = 0; b < (seqs[i].prompt_len + 32) / kBlockSize + 1; ++b)
      seqs[i].blocks.push_back(i * 8 + b);
  }
  const int decode_steps = 24;
  for (int step = 0; step < batch + decode_steps; ++step) {
    std::vector<runtime::SeqChunk> chunks;
    std::vector<int> active;
    for (int i = 0; i < batch; ++i) {
      Seq& s = seqs[i];
      if (i > step || int(s.tokens.size()) - s.prompt_len >= decode_steps) continue;
      chunks.push_back({s.tokens, s.computed, int(s.tokens.size()) - s.computed, s.blocks,
                        runtime::SeqChunk::Logits::kLast});
      active.push_back(i);
    }
    if (chunks.empty()) break;
    std::vector<float> logits = runner.execute(chunks);
    for (size_t r = 0; r < active.size(); ++r) {
      Seq& s = seqs[active[r]];
      const float* row = &logits[r * vocab];
      s.computed = int(s.tokens.size());
      s.tokens.push_back(int(std::max_element(row, row + vocab) - row));
      s.rows.emplace_back(row, row + vocab);
    }
  }
  return seqs;
}

TEST_P(GpuModel, GreedyTokensMatchCpuInMixedBatches) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const std::string dir = fixture_dir(GetParam());
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not generated yet";
  for (int batch : {1, 5, 64}) {
    auto cpu = make_runner(dir, false);
    auto gpu = make_runner(dir, true);
    const int vocab = cpu->model().config().vocab_size;
    auto want = run_staggered(*cpu, batch, vocab);
    auto got = run_staggered(*gpu, batch, vocab);
    int compared = 0, ties = 0;
    std::vector<double> errors;
    for (int i = 0; i < batch; ++i) {
      const Seq& w = want[i];
      for (size_t t = 0; t < w.rows.size(); ++t, ++compared) {
        const std::vector<float>& row = got[i].rows[t];
        errors.push_back(testing::rel_l2(row, w.rows[t]));
        const size_t pos = w.prompt_len + t;
        if (got[i].tokens[pos] == w.tokens[pos]) continue;
        const float margin = testing::top_margin(w.rows[t]),
                    diff = testing::max_abs_diff(row, w.rows[t]);
        EXPECT_LE(margin, 2 * diff)
            << GetParam() << " batch " << batch << " seq " << i << " token " << t << ": gpu "
            << got[i].tokens[pos] << " cpu " << w.tokens[pos];
        ++ties;
        break;  // later tokens of this sequence continue from different text
      }
    }
    expect_rows_within_tolerance(errors, row_rule(*cpu, dir),
                                 GetParam() + " batch " + std::to_string(batch));
    // Ties must stay rare, or the comparison would cover little.
    EXPECT_GE(compared, batch * 12) << ties << " near-ties";
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GpuModel,
                         ::testing::Values("llama", "qwen3", "qwen3_moe", "mixtral", "demo",
                                           "qwen2", "qwen2_moe", "qwen3_yarn", "llama_bias", "phi3",
                                           "deepseek_v3", "deepseek_v2"));
// The quantized checkpoints (W4A16 NVFP4 and W8A16 FP8 linears, NVFP4 experts, 32 × 32 block
// FP8 experts, DeepSeek's MLA on block FP8 with partial blocks): their golden logits come from
// transformers with the same dequantized weights, so the bf16 tolerances above hold. Prompts of ≤ 8
// tokens and the decode steps take the decode GEMV (the SwiGLU epilogue on tiled gate/up rows),
// longer prompts and the mixed batches the mma kernel and the dequantize + cuBLASLt path.
INSTANTIATE_TEST_SUITE_P(Quantized, GpuModel,
                         ::testing::Values("llama_nvfp4_modelopt", "llama_fp8_modelopt",
                                           "qwen3_moe_nvfp4_ct", "qwen3_moe_fp8_block",
                                           "deepseek_v3_fp8_block"));

}  // namespace
}  // namespace serval
