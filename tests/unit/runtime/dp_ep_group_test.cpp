// Data parallel with expert parallel on the CPU backend (runtime/dp_ep_group.h): two replicas,
// each with its own requests and KV cache, whose MoE layers run together with the experts split
// over all ranks, give every request the logits and greedy tokens it gets alone on one rank (up
// to the fp32 summation order of the all-reduces), whether the replicas step at the same time,
// one after the other, or one of them idles (its dummy steps must not disturb the other's KV).
#include "runtime/dp_ep_group.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "base/error.h"
#include "io/model_config.h"
#include "model/model.h"
#include "support/greedy_steps.h"

namespace serval::runtime {
namespace {

constexpr int kBlockSize = 16, kBlocksPerSeq = 4, kSeqs = 2, kSteps = 12;
constexpr int kBlocks = kSeqs * kBlocksPerSeq + 1;  // + the group's reserved block

std::string fixture(const std::string& name) {
  return (std::filesystem::path(SERVAL_SOURCE_DIR) / "tests/fixtures" / name).string();
}

using RunResult = serval::testing::GreedySteps;

// kSeqs prompts (seeded by `seed`), prefilled with every logits row, then greedy decode.
RunResult run(StepRunner& runner, int vocab, int seed) {
  std::vector<std::vector<int32_t>> prompts(kSeqs), tables(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    for (int i = 0; i < 4 + 5 * s + seed % 3; ++i)
      prompts[s].push_back((31 * (i + 1) + 97 * s + 53 * seed) % vocab);
    for (int b = 0; b < kBlocksPerSeq; ++b) tables[s].push_back(s * kBlocksPerSeq + b);
  }
  return serval::testing::prefill_and_decode(runner, vocab, std::move(prompts), tables, kSteps);
}

void expect_same(const RunResult& got, const RunResult& want) {
  ASSERT_EQ(got.prompt_logits.size(), want.prompt_logits.size());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < want.prompt_logits.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(want.prompt_logits[i]));
    max_diff = std::max(max_diff, std::fabs(got.prompt_logits[i] - want.prompt_logits[i]));
  }
  ASSERT_GT(max_abs, 0.0f);
  EXPECT_LE(max_diff, 1e-4f * max_abs);  // fp32; only the order of partial sums differs
  EXPECT_EQ(got.tokens, want.tokens);
}

std::shared_ptr<DpEpGroup> make_group(const io::ModelConfig& config,
                                      const model::WeightSource& weights, int tp) {
  ParallelLoadOptions o;
  o.parallel = {tp, 2, true};
  o.dp_attention = true;
  o.block_size = kBlockSize;
  o.num_blocks = [](backend::Backend&, const model::Model&) { return kBlocks; };
  return std::make_unique<DpEpGroup>(load_parallel_runner(config, weights, o), o.parallel, kBlocks);
}

class DpEpGroupTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DpEpGroupTest, ReplicasMatchOneRank) {
  const io::ModelConfig config = io::load_model_config(fixture(GetParam()));
  auto weights = model::open_checkpoint_weights(fixture(GetParam()));
  const int vocab = config.vocab_size;
  std::vector<RunResult> ref;
  for (int seed : {1, 2}) {
    auto backend = backend::make_cpu_backend();
    auto m = model::create_model(config, *weights, *backend, {});
    ModelRunner one(std::move(backend), std::move(m), kBlocks, kBlockSize);
    ref.push_back(run(one, vocab, seed));
  }
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    auto group = make_group(config, *weights, tp);
    EXPECT_EQ(group->engine_blocks(), kBlocks - 1);
    auto r0 = dp_ep_replica(group, 0), r1 = dp_ep_replica(group, 1);
    {
      SCOPED_TRACE("both replicas at once");
      RunResult got0, got1;
      std::thread t([&] { got1 = run(*r1, vocab, 2); });
      got0 = run(*r0, vocab, 1);
      t.join();
      expect_same(got0, ref[0]);
      expect_same(got1, ref[1]);
    }
    {
      SCOPED_TRACE("replica 1 alone (replica 0 takes dummy steps), then replica 0 alone");
      expect_same(run(*r1, vocab, 2), ref[1]);
      expect_same(run(*r0, vocab, 1), ref[0]);
    }
  }
}

// qwen2_moe: its gated shared expert runs on each replica's own rows after the experts' combine.
INSTANTIATE_TEST_SUITE_P(Fixtures, DpEpGroupTest,
                         ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"));

// Why idle replicas take a dummy step instead of an empty one: a step needs a token.
TEST(DpEpGroup, AnEmptyStepIsRefused) {
  const io::ModelConfig config = io::load_model_config(fixture("qwen3_moe"));
  auto weights = model::open_checkpoint_weights(fixture("qwen3_moe"));
  auto backend = backend::make_cpu_backend();
  auto m = model::create_model(config, *weights, *backend, {});
  ModelRunner one(std::move(backend), std::move(m), kBlocks, kBlockSize);
  EXPECT_THROW(one.execute({}), InvalidArgument);
}

TEST(DpEpGroup, NeedsExpertParallelAndAReservedBlock) {
  const io::ModelConfig config = io::load_model_config(fixture("qwen3_moe"));
  auto weights = model::open_checkpoint_weights(fixture("qwen3_moe"));
  ParallelLoadOptions o;
  o.parallel = {1, 2, false};  // replicas without expert parallel share no layers
  o.dp_attention = true;
  o.block_size = kBlockSize;
  o.num_blocks = [](backend::Backend&, const model::Model&) { return kBlocks; };
  EXPECT_THROW(load_parallel_runner(config, *weights, o), InvalidArgument);
  o.parallel = {1, 2, true};
  EXPECT_THROW(DpEpGroup(load_parallel_runner(config, *weights, o), o.parallel, 1),
               InvalidArgument);
}

}  // namespace
}  // namespace serval::runtime
