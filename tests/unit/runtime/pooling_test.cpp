// --runner pooling: each request's update is its prompt's last final hidden state. The oracle is
// transformers' golden logits: for the tied qwen3 fixture, hidden · embedding tableᵀ must give
// the golden logits of the prompt's last position. Several prompts at once (batched, chunked)
// give the same embeddings as each alone.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "base/error.h"
#include "io/safetensors.h"
#include "kernels/cpu/ops.h"
#include "runtime/engine.h"
#include "support/compare.h"

namespace serval::runtime {
namespace {

std::filesystem::path fixture() {
  return std::filesystem::path(SERVAL_SOURCE_DIR) / "tests/fixtures/qwen3";
}

EngineConfig pooling_config() {
  EngineConfig cfg;
  cfg.model_dir = fixture().string();
  cfg.device = "cpu";
  cfg.max_model_len = 128;
  cfg.max_num_seqs = 8;
  cfg.cpu_kv_cache_bytes = 16 << 20;
  cfg.pooling = true;
  return cfg;
}

// The embeddings of `prompts`, submitted together; every update must be a finished embedding.
std::vector<std::vector<float>> embed(Engine& engine,
                                      const std::vector<std::vector<int32_t>>& prompts) {
  std::mutex mu;
  std::condition_variable cv;
  std::map<size_t, RequestOutput> outs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.max_tokens = 1;
    engine.submit(prompts[i], p, [&, i](const RequestOutput& o) {
      std::lock_guard lock(mu);
      EXPECT_FALSE(outs.contains(i)) << "a second update";
      outs[i] = o;
      cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  EXPECT_TRUE(
      cv.wait_for(lock, std::chrono::seconds(60), [&] { return outs.size() == prompts.size(); }));
  std::vector<std::vector<float>> result;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestOutput& o = outs.at(i);
    EXPECT_EQ(o.finish, FinishReason::kStop);
    EXPECT_TRUE(o.new_token_ids.empty());
    EXPECT_EQ(o.num_prompt_tokens, int(prompts[i].size()));
    result.push_back(o.embedding);
  }
  return result;
}

TEST(Pooling, LastHiddenStateReproducesTheGoldenLogits) {
  auto engine = Engine::create(pooling_config());
  ASSERT_TRUE(engine->info().pooling);
  const int H = engine->info().hidden_size, V = engine->info().vocab_size;
  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(fixture() / "golden.json"));
  const auto weights = io::SafetensorsFile::open((fixture() / "model.safetensors").string());
  const io::TensorInfo* embed_table = weights->find("model.embed_tokens.weight");  // tied head
  ASSERT_NE(embed_table, nullptr);
  ASSERT_EQ(embed_table->numel(), int64_t(V) * H);
  std::vector<float> table(size_t(V) * H);
  kernels::cpu::to_float(embed_table->data, embed_table->dtype, table.data(),
                         int64_t(table.size()));
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : golden["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
  const std::vector<std::vector<float>> together = embed(*engine, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "prompt " << i);
    ASSERT_EQ(together[i].size(), size_t(H));
    std::vector<float> logits(static_cast<size_t>(V));
    for (int v = 0; v < V; ++v) {
      double dot = 0;
      for (int h = 0; h < H; ++h) dot += double(together[i][h]) * table[size_t(v) * H + h];
      logits[v] = float(dot);
    }
    const std::vector<float> want = golden["prompts"][i]["logits"].back().get<std::vector<float>>();
    EXPECT_LT(serval::testing::rel_l2(logits, want), 1e-4);
    // Alone (and, the second time, from the prefix cache) the same vector.
    for (int again = 0; again < 2; ++again)
      EXPECT_LT(serval::testing::rel_l2(embed(*engine, {prompts[i]})[0], together[i]), 1e-6);
  }
  // A prompt longer than the context is refused; one of exactly max_model_len tokens is not.
  SamplingParams p;
  EXPECT_THROW(engine->submit(std::vector<int32_t>(129, 5), p, [](const RequestOutput&) {}),
               InvalidArgument);
  p.prompt_logprobs = 1;  // rows are hidden states, not logits
  EXPECT_THROW(engine->submit({1, 2}, p, [](const RequestOutput&) {}), InvalidArgument);
  p.prompt_logprobs = -1;
  EXPECT_EQ(embed(*engine, {std::vector<int32_t>(128, 5)})[0].size(), size_t(H));
}

}  // namespace
}  // namespace serval::runtime
