// Tensor and expert parallel over NCCL on two GPUs: for every fixture, TP=2, TP=2+EP and EP over
// two ranks give prompt logits within bf16 tolerance of one GPU, and the same greedy tokens
// wherever one GPU's top-1/top-2 margin exceeds twice the row's largest difference (below that a
// flip is a bf16 near-tie: partial sums are rounded to bf16 before the all-reduce). MoE
// fixtures may also meet a router near-tie in decode: the all-reduced hidden state is rounded
// differently from one GPU's, the router picks another expert and that step's logits move far
// beyond bf16 noise (Mixtral TP=2, seq 2 step 11: rel L2 0.13 with NCCL and with the P2P
// all-reduce alike). From the first such step the sequence is compared as vLLM's
// check_logprobs_close does: each run's greedy token must be among the other's top 5, then the
// texts may part. With CUDA graphs (the all-reduces captured) TP=2 decode logits equal the eager
// TP=2 run bit for bit, and queued steps with their tokens fed back on the device give the
// synchronous steps' tokens.
// Skipped with fewer than two GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "io/model_config.h"
#include "kernels/gpu_test_support.h"
#include "model/model.h"
#include "runtime/dp_ep_group.h"
#include "runtime/parallel_runner.h"
#include "support/compare.h"
#include "support/greedy_steps.h"

namespace serval::runtime {
namespace {

constexpr int kBlockSize = 16, kBlocksPerSeq = 8, kSeqs = 3, kSteps = 16, kMaxModelLen = 128;
constexpr double kLogitsRelTol = 3e-2;  // bf16 activations: relative L2 of a logits row

std::string fixture(const std::string& name) {
  return std::string(SERVAL_SOURCE_DIR) + "/tests/fixtures/" + name;
}

RunnerOptions runner_options(bool graphs, int feedback_rows = 0) {
  RunnerOptions ro;
  ro.token_feedback_rows = feedback_rows;
  ro.max_model_len = kMaxModelLen;  // the fixed decode layout, with or without graphs
  ro.max_decode_batch = kSeqs;
  ro.cuda_graphs = graphs;
  ro.step_memory_bytes = 64 << 20;  // captures allocate from the step arena only
  return ro;
}

std::unique_ptr<StepRunner> make_runner(dist::ParallelConfig p, bool graphs,
                                        const model::WeightSource& weights,
                                        const io::ModelConfig& config, int feedback_rows = 0) {
  if (p.world_size() == 1) {
    auto backend = backend::make_cuda_backend();
    auto m = model::create_model(config, weights, *backend, {});
    return std::make_unique<ModelRunner>(std::move(backend), std::move(m), kSeqs * kBlocksPerSeq,
                                         kBlockSize, runner_options(graphs, feedback_rows));
  }
  ParallelLoadOptions o;
  o.device = "cuda";
  o.parallel = p;
  o.block_size = kBlockSize;
  o.runner = runner_options(graphs, feedback_rows);
  o.num_blocks = [](backend::Backend&, const model::Model&) { return kSeqs * kBlocksPerSeq; };
  return load_parallel_runner(config, weights, o);
}

struct RunResult {
  std::vector<std::vector<float>> prompt_rows;             // every prompt token's logits
  std::vector<std::vector<int32_t>> tokens;                // prompt + kSteps greedy tokens
  std::vector<std::vector<std::vector<float>>> step_rows;  // [seq][step] logits row
  int prompt_len(int s) const { return 5 + 4 * s; }
};

// Prefill of `seqs` (≤ kSeqs) prompts (logits of every token), then greedy decode with the
// logits kept.
RunResult run(StepRunner& runner, int vocab, int seqs = kSeqs) {
  RunResult r;
  r.step_rows.resize(seqs);
  std::vector<std::vector<int32_t>> tables(seqs);
  for (int s = 0; s < seqs; ++s) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < r.prompt_len(s); ++i) prompt.push_back((37 * (i + 1) + 101 * s) % vocab);
    r.tokens.push_back(prompt);
    for (int b = 0; b < kBlocksPerSeq; ++b) tables[s].push_back(s * kBlocksPerSeq + b);
  }
  std::vector<SeqChunk> chunks;
  for (int s = 0; s < seqs; ++s)
    chunks.push_back({r.tokens[s], 0, int(r.tokens[s].size()), tables[s], SeqChunk::Logits::kAll});
  const std::vector<float> prompt = runner.execute(chunks);
  size_t row = 0;
  for (int s = 0; s < seqs; ++s) {
    for (int i = 0; i < r.prompt_len(s); ++i, ++row)
      r.prompt_rows.emplace_back(&prompt[row * vocab], &prompt[(row + 1) * vocab]);
    const std::vector<float>& last = r.prompt_rows.back();
    r.step_rows[s].push_back(last);
    r.tokens[s].push_back(int32_t(std::max_element(last.begin(), last.end()) - last.begin()));
  }
  for (int step = 1; step < kSteps; ++step) {
    chunks.clear();
    for (int s = 0; s < seqs; ++s)
      chunks.push_back({r.tokens[s], int(r.tokens[s].size()) - 1, 1, tables[s]});
    const std::vector<float> logits = runner.execute(chunks);
    for (int s = 0; s < seqs; ++s) {
      std::vector<float> rowv(&logits[size_t(s) * vocab], &logits[size_t(s + 1) * vocab]);
      r.tokens[s].push_back(int32_t(std::max_element(rowv.begin(), rowv.end()) - rowv.begin()));
      r.step_rows[s].push_back(std::move(rowv));
    }
  }
  return r;
}

// True when `token` is among the `k` largest entries of `row`.
bool in_top_k(const std::vector<float>& row, int32_t token, int k) {
  const float v = row[size_t(token)];
  return std::count_if(row.begin(), row.end(), [&](float x) { return x > v; }) < k;
}

// Compares `got` with the single-GPU reference as the header describes.
void expect_matches(const RunResult& got, const RunResult& ref, bool moe) {
  ASSERT_EQ(got.prompt_rows.size(), ref.prompt_rows.size());
  for (size_t i = 0; i < ref.prompt_rows.size(); ++i)
    EXPECT_LT(testing::rel_l2(got.prompt_rows[i], ref.prompt_rows[i]), kLogitsRelTol)
        << "prompt row " << i;
  constexpr int kTopK = 5;
  for (int s = 0; s < int(ref.step_rows.size()); ++s) {
    for (int t = 0; t < kSteps; ++t) {
      const std::vector<float>&want = ref.step_rows[s][t], &have = got.step_rows[s][t];
      const size_t pos = size_t(ref.prompt_len(s) + t);
      if (moe && testing::rel_l2(have, want) >= kLogitsRelTol) {  // a router near-tie
        EXPECT_TRUE(in_top_k(want, got.tokens[s][pos], kTopK) &&
                    in_top_k(have, ref.tokens[s][pos], kTopK))
            << "seq " << s << " step " << t << ": " << got.tokens[s][pos] << " vs "
            << ref.tokens[s][pos] << " not in each other's top " << kTopK;
        break;
      }
      EXPECT_LT(testing::rel_l2(have, want), kLogitsRelTol) << "seq " << s << " step " << t;
      if (got.tokens[s][pos] == ref.tokens[s][pos]) continue;
      EXPECT_LE(testing::top_margin(want), 2 * testing::max_abs_diff(have, want))
          << "seq " << s << " step " << t << ": " << got.tokens[s][pos] << " vs "
          << ref.tokens[s][pos];
      break;  // the texts differ from here on
    }
  }
}

// Graph replays give the eager run's tokens and decode logits bit for bit.
void expect_graphs_equal_eager(const RunResult& graphs, const RunResult& eager) {
  EXPECT_EQ(graphs.tokens, eager.tokens);
  ASSERT_EQ(graphs.step_rows.size(), eager.step_rows.size());
  for (size_t s = 0; s < eager.step_rows.size(); ++s)
    for (int t = 1; t < kSteps; ++t)
      EXPECT_EQ(graphs.step_rows[s][t], eager.step_rows[s][t]) << "seq " << s << " step " << t;
}

class ParallelGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelGpu, MatchesOneGpu) {
  if (testing::gpu_count_for_collectives() < 2) GTEST_SKIP() << "needs two CUDA GPUs: skipped";
  const io::ModelConfig config = io::load_model_config(fixture(GetParam()));
  auto weights = model::open_checkpoint_weights(fixture(GetParam()));
  const RunResult ref =
      run(*make_runner({1, 1, false}, false, *weights, config), config.vocab_size);
  struct Case {
    const char* name;
    dist::ParallelConfig parallel;
  };
  for (const Case& c : {Case{"tp2", {2, 1, false}}, Case{"tp2+ep", {2, 1, true}},
                        Case{"ep over 2 ranks", {1, 2, true}}}) {
    SCOPED_TRACE(GetParam() + " " + c.name);
    expect_matches(run(*make_runner(c.parallel, false, *weights, config), config.vocab_size), ref,
                   config.num_experts > 0);
  }
}

TEST_P(ParallelGpu, GraphsEqualEagerWithCollectives) {
  if (testing::gpu_count_for_collectives() < 2) GTEST_SKIP() << "needs two CUDA GPUs: skipped";
  const io::ModelConfig config = io::load_model_config(fixture(GetParam()));
  auto weights = model::open_checkpoint_weights(fixture(GetParam()));
  const RunResult eager =
      run(*make_runner({2, 1, false}, false, *weights, config), config.vocab_size);
  expect_graphs_equal_eager(
      run(*make_runner({2, 1, false}, true, *weights, config), config.vocab_size), eager);
}

// One and two sequences: decode steps of 1-4 tokens take the CUDA backend's fused MoE norm +
// router kernel after the (P2P) all-reduce (and 1-2 tokens route inside the expert GEMVs); eager
// and CUDA graphs (their replays, not only the warm-ups) against one GPU and each other.
TEST_P(ParallelGpu, OneAndTwoSequencesMatchOneGpu) {
  if (testing::gpu_count_for_collectives() < 2) GTEST_SKIP() << "needs two CUDA GPUs: skipped";
  const io::ModelConfig config = io::load_model_config(fixture(GetParam()));
  auto weights = model::open_checkpoint_weights(fixture(GetParam()));
  for (int seqs : {1, 2}) {
    SCOPED_TRACE(GetParam() + " tp2, " + std::to_string(seqs) + " sequences");
    const RunResult ref =
        run(*make_runner({1, 1, false}, false, *weights, config), config.vocab_size, seqs);
    const RunResult eager =
        run(*make_runner({2, 1, false}, false, *weights, config), config.vocab_size, seqs);
    expect_matches(eager, ref, config.num_experts > 0);
    expect_graphs_equal_eager(
        run(*make_runner({2, 1, false}, true, *weights, config), config.vocab_size, seqs), eager);
  }
}

// The quantized Llamas split packed NVFP4 / FP8 weights and their scales over the ranks.
// Token feedback on a TP=2 group (graphs and eager): steps queued behind each other, rows
// reordered, a prefill joining decodes, give the synchronous steps' tokens.
TEST_P(ParallelGpu, TokenFeedbackGeneratesTheSynchronousTokens) {
  if (testing::gpu_count_for_collectives() < 2) GTEST_SKIP() << "needs two CUDA GPUs: skipped";
  const io::ModelConfig config = io::load_model_config(fixture(GetParam()));
  auto weights = model::open_checkpoint_weights(fixture(GetParam()));
  std::vector<std::vector<int32_t>> prompts(kSeqs), tables(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    for (int i = 0; i < 5 + 4 * s; ++i) prompts[s].push_back((37 * (i + 1) + 101 * s) % 97);
    for (int b = 0; b < kBlocksPerSeq; ++b) tables[s].push_back(s * kBlocksPerSeq + b);
  }
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(GetParam() + (graphs ? " graphs" : " eager"));
    auto reference = make_runner({2, 1, false}, graphs, *weights, config);
    auto queued = make_runner({2, 1, false}, graphs, *weights, config, kSeqs);
    ASSERT_TRUE(queued->supports_token_feedback());
    EXPECT_EQ(testing::reordered_greedy_decode(*queued, prompts, tables, kSteps, true),
              testing::reordered_greedy_decode(*reference, prompts, tables, kSteps, false));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParallelGpu,
                         ::testing::Values("llama", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe",
                                           "llama_nvfp4_modelopt", "llama_fp8_modelopt"));

// Data parallel with expert parallel on two GPUs (dp_ep_group.h): two replicas, one GPU each,
// running their own requests at the same time with the experts split over both GPUs, each
// match one GPU as the tests above compare (the engine refuses this mode on CUDA until this
// passes on the two-GPU machine).
class ParallelGpuDpEp : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelGpuDpEp, ReplicasMatchOneGpu) {
  if (testing::gpu_count_for_collectives() < 2) GTEST_SKIP() << "needs two CUDA GPUs: skipped";
  const io::ModelConfig config = io::load_model_config(fixture(GetParam()));
  auto weights = model::open_checkpoint_weights(fixture(GetParam()));
  const RunResult ref =
      run(*make_runner({1, 1, false}, false, *weights, config), config.vocab_size);
  ParallelLoadOptions o;
  o.device = "cuda";
  o.parallel = {1, 2, true};
  o.dp_attention = true;
  o.block_size = kBlockSize;
  o.runner = runner_options(false);
  const int blocks = kSeqs * kBlocksPerSeq + 1;  // + the group's reserved block
  o.num_blocks = [blocks](backend::Backend&, const model::Model&) { return blocks; };
  auto group =
      std::make_shared<DpEpGroup>(load_parallel_runner(config, *weights, o), o.parallel, blocks);
  auto r0 = dp_ep_replica(group, 0), r1 = dp_ep_replica(group, 1);
  RunResult got0, got1;
  std::thread t([&] { got1 = run(*r1, config.vocab_size); });
  got0 = run(*r0, config.vocab_size);
  t.join();
  SCOPED_TRACE(GetParam());
  expect_matches(got0, ref, true);
  expect_matches(got1, ref, true);
  // Replica 1 alone: replica 0 takes dummy steps on its reserved block.
  expect_matches(run(*r1, config.vocab_size), ref, true);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParallelGpuDpEp,
                         ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"));

}  // namespace
}  // namespace serval::runtime
