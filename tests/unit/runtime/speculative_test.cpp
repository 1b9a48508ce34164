// Speculative decoding by prompt lookup (runtime/speculative.h): the --speculative-config
// parser, the n-gram proposer, and an engine with it giving exactly the tokens, logprobs and
// finish reasons of one without it (greedy, and seeded sampling with penalties), with drafts
// proposed and accepted, and the prefix cache left sound for the requests after it.
#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/engine.h"
#include "support/engine_batch.h"

namespace serval::runtime {
namespace {

TEST(SpeculativeConfig, ParsesNgramWithVllmDefaults) {
  EXPECT_FALSE(parse_speculative_config("").enabled());
  SpeculativeConfig c =
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4})");
  EXPECT_EQ(c.num_speculative_tokens, 4);
  EXPECT_EQ(c.prompt_lookup_min, 5);
  EXPECT_EQ(c.prompt_lookup_max, 5);
  c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})");
  EXPECT_EQ(c.prompt_lookup_min, 4);
  EXPECT_EQ(c.prompt_lookup_max, 4);
  c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2,
          "prompt_lookup_max": 6})");
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_EQ(c.prompt_lookup_max, 6);
  EXPECT_EQ(c.disable_by_batch_size, 0);
  EXPECT_TRUE(c.drafts_at(100000));
  c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 8})");
  EXPECT_EQ(c.disable_by_batch_size, 8);
  EXPECT_TRUE(c.drafts_at(7));
  EXPECT_FALSE(c.drafts_at(8));
}

TEST(SpeculativeConfig, RefusesWhatItCannotRun) {
  for (const char* bad : {
           "ngram",                                                              // not an object
           R"({"num_speculative_tokens": 4})",                                   // no method
           R"({"method": "eagle", "num_speculative_tokens": 4})",                // another method
           R"({"method": "ngram"})",                                             // no count
           R"({"method": "ngram", "num_speculative_tokens": 0})",                // not positive
           R"({"method": "ngram", "num_speculative_tokens": "4"})",              // not a number
           R"({"method": "ngram", "num_speculative_tokens": 4, "model": "x"})",  // unknown key
           R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5,
               "prompt_lookup_max": 3})",                                        // min > max
           R"({"method": "ngram", "num_speculative_tokens": 4,
               "disable_by_batch_size": 1})",                                    // never drafts
           R"({"method": "ngram", "num_speculative_tokens": 4,
               "disable_by_batch_size": 2.5})",                                  // not an integer
       })
    EXPECT_THROW(parse_speculative_config(bad), InvalidArgument) << bad;
}

// The proposer's contract as a plain scan of the whole sequence: for n from prompt_lookup_max
// down to prompt_lookup_min, the most recent earlier occurrence of the last n tokens, and what
// followed it.
std::vector<int32_t> scan_ngram(std::span<const int32_t> tokens, const SpeculativeConfig& c,
                                int max_drafts) {
  const int len = int(tokens.size());
  if (max_drafts <= 0) return {};
  for (int n = std::min(c.prompt_lookup_max, len - 1); n >= c.prompt_lookup_min; --n) {
    const std::span<const int32_t> suffix = tokens.last(size_t(n));
    for (int i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      const int from = i + n, count = std::min(max_drafts, len - from);
      return {tokens.begin() + from, tokens.begin() + from + count};
    }
  }
  return {};
}

// A fresh index's proposal for a whole sequence.
std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, const SpeculativeConfig& c,
                                   int max_drafts) {
  return NgramIndex().propose(tokens, c, max_drafts);
}

TEST(NgramProposer, TakesWhatFollowedTheMostRecentEarlierOccurrence) {
  const SpeculativeConfig c{3, 1, 3};
  // "7 8 9" ends the sequence and occurred at 0 (then 1 2) and at 5 (then 4 4): the later wins.
  const std::vector<int32_t> t = {7, 8, 9, 1, 2, 7, 8, 9, 4, 4, 7, 8, 9};
  EXPECT_EQ(propose_ngram(t, c, 3), (std::vector<int32_t>{4, 4, 7}));
  EXPECT_EQ(propose_ngram(t, c, 1), (std::vector<int32_t>{4}));
  EXPECT_TRUE(propose_ngram(t, c, 0).empty());
  // The longest n-gram first: "5 6" recurs (then 1), "6" alone more recently (then 2).
  const std::vector<int32_t> u = {5, 6, 1, 6, 2, 5, 6};
  EXPECT_EQ(propose_ngram(u, SpeculativeConfig{4, 1, 2}, 4), (std::vector<int32_t>{1, 6, 2, 5}));
  EXPECT_EQ(propose_ngram(u, SpeculativeConfig{4, 1, 1}, 2), (std::vector<int32_t>{2, 5}));
  // Proposals stop at the end of the sequence; nothing recurs: nothing proposed.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{3, 3}, c, 3), (std::vector<int32_t>{3}));
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1, 2, 3, 4}, c, 3).empty());
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1}, c, 3).empty());
  // n-grams shorter than prompt_lookup_min are not tried.
  EXPECT_TRUE(propose_ngram(u, SpeculativeConfig{4, 3, 3}, 4).empty());
}

// The index gives the scan's proposals, step after step of a growing sequence
// (random tokens from a small vocabulary: many repeats and partial matches).
TEST(NgramProposer, IndexAgreesWithTheScan) {
  std::mt19937 rng(7);
  for (const SpeculativeConfig c : {SpeculativeConfig{4, 1, 3}, SpeculativeConfig{3, 2, 5},
                                    SpeculativeConfig{2, 4, 4}, SpeculativeConfig{5, 1, 1}}) {
    for (int seq = 0; seq < 50; ++seq) {
      NgramIndex index;
      std::vector<int32_t> tokens;
      const int vocab = 2 + seq % 5;
      for (int step = 0; step < 80; ++step) {
        tokens.push_back(int32_t(rng() % uint32_t(vocab)));
        const int max_drafts = int(rng() % 6);
        ASSERT_EQ(index.propose(tokens, c, max_drafts), scan_ngram(tokens, c, max_drafts))
            << "lookup " << c.prompt_lookup_min << ".." << c.prompt_lookup_max << ", sequence "
            << seq << ", length " << tokens.size();
      }
    }
  }
}

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<LogprobEntry> logprobs;
  FinishReason finish = FinishReason::kAbort;
};

// Request i's sampling: greedy, stopping at EOS or after 20 + i % 7 tokens.
SamplingParams greedy_params(size_t i) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 20 + int(i % 7);
  return sp;
}

// Repetitive prompts (prompt lookup finds n-grams in them, and in the random model's looping
// continuations).
std::vector<std::vector<int32_t>> repetitive_prompts(int requests) {
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(requests));
  for (int i = 0; i < requests; ++i)
    for (int rep = 0; rep < 3; ++rep)
      for (int t = 0; t < 3 + i % 3; ++t) prompts[size_t(i)].push_back(int32_t(20 + 7 * i + t));
  return prompts;
}

// One request per prompt, all at once, request i with params(i).
std::vector<Generated> run_requests(Engine& engine,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    SamplingParams (*params)(size_t) = greedy_params) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Generated> out(prompts.size());
  size_t done = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine.submit(prompts[i], params(i), [&, i](const RequestOutput& o) {
      std::lock_guard lock(mu);
      Generated& g = out[i];
      g.tokens.insert(g.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      g.logprobs.insert(g.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finish) {
        g.finish = *o.finish;
        ++done;
        cv.notify_all();
      }
    });
  }
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == prompts.size(); }));
  return out;
}

// Each prompt followed by the first 16 tokens generated for it: its blocks were computed while
// decoding the first round (speculatively, by the engine under test).
std::vector<std::vector<int32_t>> extended(const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<Generated>& first) {
  std::vector<std::vector<int32_t>> out = prompts;
  for (size_t i = 0; i < out.size(); ++i)
    out[i].insert(out[i].end(), first[i].tokens.begin(),
                  first[i].tokens.begin() + std::min<size_t>(16, first[i].tokens.size()));
  return out;
}

void expect_same(const std::vector<Generated>& want, const std::vector<Generated>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "request " << i;
    for (size_t t = 0; t < want[i].logprobs.size(); ++t) {
      const LogprobEntry &a = got[i].logprobs[t], &b = want[i].logprobs[t];
      EXPECT_EQ(a.sampled.token_id, b.sampled.token_id);
      EXPECT_EQ(a.sampled.logprob, b.sampled.logprob) << "request " << i << " token " << t;
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t k = 0; k < a.top.size(); ++k) EXPECT_EQ(a.top[k].token_id, b.top[k].token_id);
    }
  }
}

// Runs `prompts` (request i with params(i)) on an engine of `plain`, then on one with
// `speculative_config` added, expects the same outputs, and returns the latter's stats.
EngineStats expect_same_with_drafts(const EngineConfig& plain,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    const std::string& speculative_config,
                                    SamplingParams (*params)(size_t) = greedy_params) {
  auto ref_engine = Engine::create(plain);
  const std::vector<Generated> want = run_requests(*ref_engine, prompts, params);
  ref_engine->shutdown();
  EngineConfig spec = plain;
  spec.speculative_config = speculative_config;
  auto engine = Engine::create(spec);
  expect_same(want, run_requests(*engine, prompts, params));
  const EngineStats stats = engine->stats();
  engine->shutdown();
  return stats;
}

TEST(SpeculativeDecoding, SameGreedyTokensAsWithout) {
  const std::vector<std::vector<int32_t>> prompts = repetitive_prompts(12);
  EngineConfig plain = serval::testing::qwen3_moe_cpu_config();
  auto ref_engine = Engine::create(plain);
  const std::vector<Generated> want = run_requests(*ref_engine, prompts);
  const std::vector<std::vector<int32_t>> again = extended(prompts, want);
  const std::vector<Generated> want_again = run_requests(*ref_engine, again);
  ref_engine->shutdown();

  EngineConfig spec = plain;
  spec.speculative_config =
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
          "prompt_lookup_min": 1})";
  auto engine = Engine::create(spec);
  expect_same(want, run_requests(*engine, prompts));
  const EngineStats s = engine->stats();
  EXPECT_GT(s.spec_decode_num_drafts, 0);
  EXPECT_GE(s.spec_decode_num_draft_tokens, s.spec_decode_num_drafts);
  EXPECT_GT(s.spec_decode_num_accepted_tokens, 0);
  EXPECT_LE(s.spec_decode_num_accepted_tokens, s.spec_decode_num_draft_tokens);
  // Fewer steps than tokens: accepted drafts came for free.
  EXPECT_LT(s.steps_total, s.generation_tokens_total);
  // Prompts that continue into the first round's outputs, served partly from the blocks cached
  // while decoding them: none may hold a rejected draft's KV.
  expect_same(want_again, run_requests(*engine, again));
  EXPECT_GT(engine->stats().prefix_cache_hits, 0);
  engine->shutdown();
}

// Requests that sample on the host: seeded temperature sampling with top-p and penalties, and
// greedy ones with logprobs (two of them guided to a JSON object). Each checked position is
// sampled as plain decoding samples it (the same random draws), so the outputs and logprobs are
// the same.
SamplingParams sampled_params(size_t i) {
  SamplingParams sp = greedy_params(i);
  if (i % 3 == 2) {
    sp.logprobs = 2;                                          // greedy, but sampled on the host
    if (i % 2 == 1) sp.json_grammar = json_object_grammar();  // and guided: a JSON object
    return sp;
  }
  sp.temperature = 0.7f;
  sp.top_p = 0.95f;
  sp.seed = 1000 + i;
  if (i % 3 == 1) sp.presence_penalty = 0.3f;
  if (i % 4 == 0) sp.logprobs = 1;
  return sp;
}

TEST(SpeculativeDecoding, SameSampledTokensAndLogprobsAsWithout) {
  const EngineStats s = expect_same_with_drafts(
      serval::testing::qwen3_moe_cpu_config(), repetitive_prompts(12),
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
          "prompt_lookup_max": 3})",
      sampled_params);
  EXPECT_GT(s.spec_decode_num_accepted_tokens, 0);
}

// A step budget smaller than a request's drafts (a chunk cut before its last draft) and room
// for a few sequences (preemptions undo drafts): still the same tokens.
TEST(SpeculativeDecoding, SameTokensUnderATightBudget) {
  EngineConfig plain = serval::testing::qwen3_moe_cpu_config();
  plain.max_num_batched_tokens = 128;
  plain.max_num_seqs = 4;
  const EngineStats s = expect_same_with_drafts(
      plain, repetitive_prompts(10),
      R"({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1,
          "prompt_lookup_max": 2})");
  EXPECT_GT(s.spec_decode_num_accepted_tokens, 0);
}

// A KV cache of 16 blocks for requests that need ~30: running requests, drafts appended, are
// preempted and recomputed (their drafts' blocks freed with them), and later ones are served
// partly from the prefix cache: still the same tokens.
TEST(SpeculativeDecoding, SameTokensUnderPreemption) {
  EngineConfig plain = serval::testing::qwen3_moe_cpu_config();
  plain.cpu_kv_cache_bytes = 16 * 16 * 768;  // 16 blocks: 768 bytes of f32 KV per token
  const EngineStats s = expect_same_with_drafts(
      plain, repetitive_prompts(10),
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
          "prompt_lookup_max": 3})");
  EXPECT_GT(s.num_preemptions, 0);
  EXPECT_GT(s.spec_decode_num_accepted_tokens, 0);
}

// disable_by_batch_size: with 12 requests at once, drafts only once fewer than 4 run (the
// stragglers); a threshold above the batch drafts as if it were absent. The same tokens both
// ways.
TEST(SpeculativeDecoding, NoDraftsWhileTheBatchIsLarge) {
  const EngineConfig plain = serval::testing::qwen3_moe_cpu_config();
  const std::vector<std::vector<int32_t>> prompts = repetitive_prompts(12);
  const auto config = [](int threshold) {
    return R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
               "prompt_lookup_max": 3, "disable_by_batch_size": )" +
           std::to_string(threshold) + "}";
  };
  const EngineStats high = expect_same_with_drafts(plain, prompts, config(100));
  const EngineStats low = expect_same_with_drafts(plain, prompts, config(4));
  EXPECT_GT(high.spec_decode_num_drafts, 0);
  EXPECT_LT(low.spec_decode_num_drafts, high.spec_decode_num_drafts);
  EXPECT_GT(low.steps_total, high.steps_total);
}

}  // namespace
}  // namespace serval::runtime
