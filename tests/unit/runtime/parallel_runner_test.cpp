// Tensor and expert parallel on the CPU backend: every fixture run as TP=2, TP=4 (KV heads
// replicated), TP=2+EP and EP alone (2 ranks) gives the prompt logits of TP=1 up to the
// summation order of the all-reduce (fp32) and the same greedy tokens, the NVFP4 and FP8
// fixtures too (sliced packed weights); and an engine with
// tensor_parallel_size = 2 generates what the single-rank engine generates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "backend/communicator.h"
#include "base/error.h"
#include "base/first_use_fence.h"
#include "io/model_config.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/parallel_runner.h"
#include "support/greedy_steps.h"

namespace serval::runtime {
namespace {

namespace fs = std::filesystem;

constexpr int kBlockSize = 16, kBlocksPerSeq = 8, kSeqs = 3, kSteps = 32;

fs::path fixture(const std::string& name) {
  return fs::path(SERVAL_SOURCE_DIR) / "tests/fixtures" / name;
}

// decode_graphs: the parallel ranks run their decode-graph warm-ups at load, alone
// (communicators local-only) and then together, as on CUDA (the CPU backend captures no graphs,
// so the steps then run eagerly).
std::unique_ptr<StepRunner> make_runner(const std::string& name, dist::ParallelConfig p,
                                        const std::unique_ptr<model::WeightSource>& weights,
                                        const io::ModelConfig& config, bool decode_graphs = false) {
  if (p.world_size() == 1) {
    auto backend = backend::make_cpu_backend();
    auto m = model::create_model(config, *weights, *backend, {});
    return std::make_unique<ModelRunner>(std::move(backend), std::move(m), kSeqs * kBlocksPerSeq,
                                         kBlockSize);
  }
  ParallelLoadOptions o;
  o.parallel = p;
  o.block_size = kBlockSize;
  o.num_blocks = [](backend::Backend&, const model::Model&) { return kSeqs * kBlocksPerSeq; };
  if (decode_graphs) {
    o.runner.cuda_graphs = true;
    o.runner.max_model_len = kBlocksPerSeq * kBlockSize;
    o.runner.max_decode_batch = kSeqs;
  }
  return load_parallel_runner(config, *weights, o);
}

using RunResult = serval::testing::GreedySteps;

// Prefill of three prompts of different lengths (logits of every token), then greedy decode.
RunResult run(StepRunner& runner, int vocab) {
  std::vector<std::vector<int32_t>> prompts(kSeqs), tables(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    for (int i = 0; i < 5 + 4 * s; ++i) prompts[s].push_back((37 * (i + 1) + 101 * s) % vocab);
    for (int b = 0; b < kBlocksPerSeq; ++b) tables[s].push_back(s * kBlocksPerSeq + b);
  }
  return serval::testing::prefill_and_decode(runner, vocab, std::move(prompts), tables, kSteps);
}

struct Case {
  const char* name;
  dist::ParallelConfig parallel;
  const char* load_error = nullptr;  // expected LoadError text: a slice off the scale grid
  bool decode_graphs = false;        // make_runner's decode-graph warm-ups at load
};

// Each case of fixture `name` against TP=1: the same logits up to fp32 summation order and the
// same greedy tokens, or the expected LoadError.
void expect_cases_match(const std::string& name, const std::vector<Case>& cases) {
  const io::ModelConfig config = io::load_model_config(fixture(name).string());
  auto weights = model::open_checkpoint_weights(fixture(name).string());
  const int vocab = config.vocab_size;
  const RunResult ref = run(*make_runner(name, {1, 1, false}, weights, config), vocab);
  float ref_max = 0;
  for (float v : ref.prompt_logits) ref_max = std::max(ref_max, std::fabs(v));
  ASSERT_GT(ref_max, 0.0f);
  for (const Case& c : cases) {
    SCOPED_TRACE(name + " " + c.name);
    if (c.load_error) {
      try {
        make_runner(name, c.parallel, weights, config);
        ADD_FAILURE() << "expected a LoadError containing '" << c.load_error << "'";
      } catch (const LoadError& e) {
        EXPECT_NE(std::string(e.what()).find(c.load_error), std::string::npos) << e.what();
      }
      continue;
    }
    auto runner = make_runner(name, c.parallel, weights, config, c.decode_graphs);
    const RunResult got = run(*runner, vocab);
    ASSERT_EQ(got.prompt_logits.size(), ref.prompt_logits.size());
    float max_diff = 0;
    for (size_t i = 0; i < ref.prompt_logits.size(); ++i)
      max_diff = std::max(max_diff, std::fabs(got.prompt_logits[i] - ref.prompt_logits[i]));
    // fp32 everywhere; only the order of the partial sums differs from TP=1.
    EXPECT_LE(max_diff, 1e-4f * ref_max) << "max |logit| " << ref_max;
    EXPECT_EQ(got.tokens, ref.tokens);
  }
}

class ParallelFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelFixtureTest, MatchesSingleRank) {
  expect_cases_match(GetParam(),
                     {
                         {"tp2", {2, 1, false}},
                         {"tp4 (kv heads replicated)", {4, 1, false}},
                         {"tp2+ep", {2, 1, true}},
                         {"tp4+ep", {4, 1, true}},
                         {"ep over 2 ranks (tp1)", {1, 2, true}},
                         {"tp2+ep after decode-graph warm-ups", {2, 1, true}, nullptr, true},
                     });
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParallelFixtureTest,
                         ::testing::Values("llama", "qwen3", "qwen3_moe", "mixtral", "qwen2",
                                           "llama_bias", "phi3"));

// Qwen2-MoE's shared expert is split like a dense MLP over the tensor-parallel group (its partial
// sum joins the experts' all-reduce, expert parallel or not); with expert parallel widened over
// data-parallel ranks it is whole on each, added by the first.
TEST(ParallelSharedExpert, MatchesSingleRank) {
  expect_cases_match("qwen2_moe", {
                                      {"tp2", {2, 1, false}},
                                      {"tp4 (kv heads replicated)", {4, 1, false}},
                                      {"tp2+ep", {2, 1, true}},
                                      {"tp4+ep", {4, 1, true}},
                                      {"ep over 2 ranks (tp1)", {1, 2, true}},
                                  });
}

// DeepSeek: multi-head latent attention splits its heads (q rows, kv_b's rows, o_proj columns;
// the latent projection replicated), the ungated shared experts split like Qwen2-MoE's.
TEST(ParallelMla, TensorParallelMatchesSingleRank) {
  for (const char* name : {"deepseek_v3", "deepseek_v2"}) {
    if (!fs::exists(fixture(name) / "config.json"))
      GTEST_SKIP() << name << ": not generated yet (tools/make_fixtures.py --only " << name << ")";
    expect_cases_match(name, {
                                 {"tp2", {2, 1, false}},
                                 {"tp4 (one head per rank)", {4, 1, false}},
                                 {"tp2+ep", {2, 1, true}},
                                 {"ep over 2 ranks (tp1)", {1, 2, true}},
                             });
  }
}

// Quantized checkpoints: tensor parallel slices the packed codes and their scales (the CPU
// backend dequantizes them exactly, so TP=1 is the oracle). A slice that would cut an NVFP4
// 16-column group or share an FP8 block between two fused parts is refused by name.
TEST(ParallelQuantized, DenseModelsMatchSingleRank) {
  for (const char* name : {"llama_nvfp4_modelopt", "llama_fp8_modelopt"})
    expect_cases_match(name,
                       {{"tp2", {2, 1, false}}, {"tp4 (kv heads replicated)", {4, 1, false}}});
}

TEST(ParallelQuantized, MoeModelsMatchSingleRank) {
  // moe_intermediate_size 32: 16 columns of down per rank at TP=2 (one NVFP4 group), 8 at TP=4.
  expect_cases_match("qwen3_moe_nvfp4_ct", {{"tp2", {2, 1, false}},
                                            {"tp2+ep", {2, 1, true}},
                                            {"ep over 2 ranks (tp1)", {1, 2, true}},
                                            {"tp4", {4, 1, false}, "16-column scale boundaries"}});
  // 32 x 32 blocks: at TP=2 the 16 k rows and 16 v rows of a rank would share one block row.
  expect_cases_match("qwen3_moe_fp8_block", {{"ep over 2 ranks (tp1)", {1, 2, true}},
                                             {"tp2", {2, 1, false}, "scale boundaries"}});
}

TEST(ParallelRunner, ShardsHaveLocalKvHeadsAndExperts) {
  const io::ModelConfig config = io::load_model_config(fixture("qwen3_moe").string());
  auto weights = model::open_checkpoint_weights(fixture("qwen3_moe").string());
  ParallelLoadOptions o;
  o.parallel = {4, 1, false};
  o.num_blocks = [](backend::Backend&, const model::Model&) { return 4; };
  auto tp4 = load_parallel_runner(config, *weights, o);
  ASSERT_EQ(tp4->size(), 4);
  for (int r = 0; r < 4; ++r) {
    // 2 KV heads over 4 ranks: one (replicated) head per rank.
    EXPECT_EQ(tp4->rank(r).model().kv_geometry().num_kv_heads, 1);
    EXPECT_EQ(tp4->rank(r).kv_cache()[0].k.dim(2), 1);
  }
  o.parallel = {3, 1, false};  // 4 heads do not split over 3 ranks
  EXPECT_THROW(load_parallel_runner(config, *weights, o), InvalidArgument);
  o.parallel = {1, 3, true};  // 8 experts do not split over 3 ranks
  EXPECT_THROW(load_parallel_runner(config, *weights, o), InvalidArgument);
}

TEST(CpuCommunicator, SumsInRankOrderAndGathersColumns) {
  constexpr int kRanks = 3;
  auto comms = backend::make_cpu_communicators(kRanks);
  std::vector<std::vector<float>> sums(kRanks), gathered(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      // Values whose float sum depends on the order: 1e8 + 1 - 1e8 ...
      std::vector<float> v = {r == 0 ? 1e8f : (r == 1 ? 1.0f : -1e8f), float(r + 1)};
      Tensor t = host_view(v.data(), DType::kF32, {2}, nullptr);
      comms[r]->all_reduce_sum(t);
      sums[r] = v;
      // Rank r holds columns [2r, 2r + 2) of a [2, 6] matrix; value 10·row + column.
      Tensor local = host_empty(DType::kF32, {2, 2});
      for (int i = 0; i < 4; ++i) local.as<float>()[i] = float(10 * (i / 2) + 2 * r + i % 2);
      Tensor out = host_empty(DType::kF32, {2, 6});
      comms[r]->all_gather_columns(local, 2 * r, out);
      gathered[r].assign(out.as<float>(), out.as<float>() + 12);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    // ((1e8 + 1) - 1e8) in float is 0: rank order, not a pairwise or reordered sum.
    EXPECT_EQ(sums[r][0], (1e8f + 1.0f) - 1e8f);
    EXPECT_EQ(sums[r][1], 6.0f);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(gathered[r][i], float(10 * (i / 6) + i % 6));
  }
}

TEST(CpuCommunicator, AbortReleasesWaitingRanks) {
  auto comms = backend::make_cpu_communicators(2);
  std::thread waiter([&] {
    std::vector<float> v(4, 1.0f);
    Tensor t = host_view(v.data(), DType::kF32, {4}, nullptr);
    EXPECT_THROW(comms[1]->all_reduce_sum(t), Error);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  comms[0]->abort();
  waiter.join();
}

// Local-only mode (the parallel group's solo warm-up): a rank's all-reduce returns its own values
// without waiting for the others; switched off, the group sums again.
TEST(CpuCommunicator, LocalOnlyRanksRunAlone) {
  auto comms = backend::make_cpu_communicators(2);
  for (auto& c : comms) c->set_local_only(true);
  std::vector<float> alone = {1.0f, 2.0f};
  Tensor t = host_view(alone.data(), DType::kF32, {2}, nullptr);
  comms[0]->all_reduce_sum(t);  // rank 1 never calls: would wait forever if it were a collective
  EXPECT_EQ(alone, (std::vector<float>{1.0f, 2.0f}));
  for (auto& c : comms) c->set_local_only(false);
  std::vector<std::vector<float>> v = {{1.0f, 2.0f}, {10.0f, 20.0f}};
  std::thread other([&] {
    Tensor u = host_view(v[1].data(), DType::kF32, {2}, nullptr);
    comms[1]->all_reduce_sum(u);
  });
  Tensor u = host_view(v[0].data(), DType::kF32, {2}, nullptr);
  comms[0]->all_reduce_sum(u);
  other.join();
  EXPECT_EQ(v[0], (std::vector<float>{11.0f, 22.0f}));
  EXPECT_EQ(v[1], (std::vector<float>{11.0f, 22.0f}));
}

// A step in which one rank waits in a collective that its peer never joins: the stall watch
// aborts the group's collectives, and the step throws an error that says so, instead of
// hanging.
TEST(ParallelRunner, StalledStepIsAbortedWithAnError) {
  const io::ModelConfig config = io::load_model_config(fixture("qwen3").string());
  auto weights = model::open_checkpoint_weights(fixture("qwen3").string());
  const std::unique_ptr<StepRunner> runner = make_runner("qwen3", {2, 1, false}, weights, config);
  auto* tp2 = dynamic_cast<ParallelRunner*>(runner.get());
  ASSERT_NE(tp2, nullptr);
  tp2->set_stall_limit(std::chrono::milliseconds(200));
  tp2->for_each_rank([](int) {});  // a step that ends in time is untouched
  const auto start = std::chrono::steady_clock::now();
  try {
    tp2->for_each_rank([&](int r) {
      if (r != 1) return;
      std::vector<float> v(4, 1.0f);
      Tensor t = host_view(v.data(), DType::kF32, {4}, nullptr);
      tp2->comm(1).all_reduce_sum(t);  // rank 0 never comes
    });
    ADD_FAILURE() << "the stalled step returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no progress"), std::string::npos) << e.what();
    // Where each rank's thread was (the CPU backend tracks no activity: between calls).
    EXPECT_NE(std::string(e.what()).find("where the ranks were: rank 0 between backend calls; "
                                         "rank 1 between backend calls"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// Each rank's thread holds its own first-use fence during its part of a call, and none outside;
// the fences of all ranks pass together (the CPU backend never needs them: this checks the wiring).
TEST(ParallelRunner, RanksHoldFirstUseFencesThatPassTogether) {
  const io::ModelConfig config = io::load_model_config(fixture("qwen3").string());
  auto weights = model::open_checkpoint_weights(fixture("qwen3").string());
  const std::unique_ptr<StepRunner> runner = make_runner("qwen3", {2, 1, false}, weights, config);
  auto* tp2 = dynamic_cast<ParallelRunner*>(runner.get());
  ASSERT_NE(tp2, nullptr);
  std::vector<FirstUseFence*> seen(2, nullptr);
  tp2->for_each_rank([&](int r) {
    FirstUseFence* f = thread_first_use_fence();
    seen[size_t(r)] = f;
    if (f == nullptr) return;
    f->before();
    f->after();
  });
  EXPECT_NE(seen[0], nullptr);
  EXPECT_NE(seen[1], nullptr);
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_EQ(thread_first_use_fence(), nullptr);
}

// Greedy generation through the engine: tensor_parallel_size 2 (and with expert parallel)
// must produce the single-rank tokens.
std::vector<int32_t> engine_tokens(int tp, bool ep) {
  EngineConfig cfg;
  cfg.model_dir = fixture("qwen3_moe").string();
  cfg.device = "cpu";
  cfg.tensor_parallel_size = tp;
  cfg.enable_expert_parallel = ep;
  cfg.max_model_len = 128;
  cfg.max_num_seqs = 4;
  cfg.cpu_kv_cache_bytes = 16 << 20;
  auto engine = Engine::create(cfg);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 24;
  sp.ignore_eos = true;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  bool done = false;
  engine->submit({3, 14, 15, 92, 65, 35}, sp, [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (o.finish) done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; });
  lock.unlock();
  engine->shutdown();
  return tokens;
}

TEST(ParallelEngine, TensorParallelGeneratesSingleRankTokens) {
  const std::vector<int32_t> ref = engine_tokens(1, false);
  ASSERT_EQ(ref.size(), 24u);
  EXPECT_EQ(engine_tokens(2, false), ref);
  EXPECT_EQ(engine_tokens(2, true), ref);
}

}  // namespace
}  // namespace serval::runtime
