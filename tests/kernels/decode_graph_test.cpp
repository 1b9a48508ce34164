// CUDA graph replay of decode steps against eager runs of the same steps, on the demo model; and
// greedy steps with their tokens fed back on the device (token feedback), graphs on and off,
// against synchronous steps.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "kernels/gpu_test_support.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "support/greedy_steps.h"

namespace serval {
namespace {

constexpr int kBlockSize = 16, kMaxModelLen = 256, kMaxBatch = 8;

const std::string kDemo = std::string(SERVAL_SOURCE_DIR) + "/models/demo";

std::unique_ptr<runtime::ModelRunner> make_runner(bool graphs, int feedback_rows = 0,
                                                  const std::string& dir = kDemo) {
  io::ModelConfig config = io::load_model_config(dir);
  auto b = backend::make_cuda_backend();
  auto weights = model::open_checkpoint_weights(dir);
  auto m = model::create_model(config, *weights, *b, {});
  runtime::RunnerOptions o;
  o.max_model_len = kMaxModelLen;
  o.max_decode_batch = kMaxBatch;
  o.cuda_graphs = graphs;
  o.step_memory_bytes = 64 << 20;
  o.token_feedback_rows = feedback_rows;
  return std::make_unique<runtime::ModelRunner>(std::move(b), std::move(m), 256, kBlockSize, o);
}

// Prefills `batch` prompts, then decodes 8 steps; returns the logits of every decode step.
std::vector<std::vector<float>> decode_logits(runtime::ModelRunner& r, int batch) {
  std::vector<std::vector<int32_t>> tokens(batch), tables(batch);
  for (int s = 0; s < batch; ++s) {
    for (int t = 0; t < 5 + 3 * s; ++t) tokens[s].push_back(10 + 17 * s + 5 * t);
    for (int b = 0; b < 4; ++b) tables[s].push_back(s * 4 + b);
  }
  std::vector<std::vector<float>> out;
  for (int step = 0; step < 9; ++step) {
    std::vector<runtime::SeqChunk> chunks;
    for (int s = 0; s < batch; ++s) {
      int start = step == 0 ? 0 : int(tokens[s].size()) - 1;
      chunks.push_back({tokens[s], start, int(tokens[s].size()) - start, tables[s],
                        runtime::SeqChunk::Logits::kLast});
    }
    std::vector<float> logits = r.execute(chunks);
    const size_t vocab = logits.size() / batch;
    for (int s = 0; s < batch; ++s) {
      const float* row = &logits[s * vocab];
      tokens[s].push_back(int32_t(std::max_element(row, row + vocab) - row));
    }
    if (step > 0) out.push_back(std::move(logits));
  }
  return out;
}

TEST(DecodeGraphs, BucketSizes) {
  EXPECT_EQ(runtime::decode_graph_buckets(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(runtime::decode_graph_buckets(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(runtime::decode_graph_buckets(300).back(), 300);
}

class DecodeGraphReplay : public ::testing::TestWithParam<std::string> {};

// The demo model (Qwen3 layers) and DeepSeek-V3's multi-head latent attention (its split-KV
// attention and head-wise projections) with an MoE.
TEST_P(DecodeGraphReplay, EqualsEagerBitForBit) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  if (!std::filesystem::exists(GetParam() + "/config.json"))
    GTEST_SKIP() << GetParam() << " not generated yet";
  auto graph = make_runner(true, 0, GetParam());
  auto eager = make_runner(false, 0, GetParam());
  ASSERT_EQ(graph->num_decode_graphs(), 4);
  // Batch sizes equal to a captured bucket run the same kernels with the same shapes.
  for (int batch : {1, 4, 8}) {
    auto want = decode_logits(*eager, batch);
    auto got = decode_logits(*graph, batch);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)))
          << "batch " << batch << " decode step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DecodeGraphReplay,
                         ::testing::Values(kDemo, std::string(SERVAL_SOURCE_DIR) +
                                                      "/tests/fixtures/deepseek_v3"));

// Decode steps queued behind each other, their inputs pending ids resolved on the device (in the
// graph's first kernel, or before an eager or mixed step's model), rows reordered between steps:
// the tokens of synchronous steps on the same runner kind.
TEST(DecodeGraphs, TokenFeedbackGeneratesTheSynchronousTokens) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  std::vector<std::vector<int32_t>> prompts(kMaxBatch), tables(kMaxBatch);
  for (int s = 0; s < kMaxBatch; ++s) {
    for (int t = 0; t < 4 + 5 * s; ++t) prompts[s].push_back(20 + 13 * s + 7 * t);
    for (int b = 0; b < 4; ++b) tables[s].push_back(s * 4 + b);
  }
  for (bool graphs : {true, false}) {
    auto reference = make_runner(graphs);
    auto queued = make_runner(graphs, kMaxBatch);
    const auto want = testing::reordered_greedy_decode(*reference, prompts, tables, 24, false);
    const auto got = testing::reordered_greedy_decode(*queued, prompts, tables, 24, true);
    EXPECT_EQ(got, want) << (graphs ? "graphs" : "eager");
  }
}

}  // namespace
}  // namespace serval
