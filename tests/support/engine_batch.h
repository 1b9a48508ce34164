// Engine-level CPU tests: the qwen3_moe fixture on the CPU, and a batch of concurrent greedy
// requests whose tokens two engine configurations must agree on.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <vector>

#include "runtime/engine.h"

namespace serval::testing {

// The tiny Qwen3-MoE fixture on the CPU: 128 positions, 8 sequences, a 16 MiB KV cache.
inline runtime::EngineConfig qwen3_moe_cpu_config() {
  runtime::EngineConfig cfg;
  cfg.model_dir = (std::filesystem::path(SERVAL_SOURCE_DIR) / "tests/fixtures/qwen3_moe").string();
  cfg.device = "cpu";
  cfg.max_model_len = 128;
  cfg.max_num_seqs = 8;
  cfg.cpu_kv_cache_bytes = 16 << 20;
  return cfg;
}

struct GreedyBatch {
  std::vector<std::vector<int32_t>> tokens;  // per request, in delivery order
  bool finish_was_last = true;               // no update arrived after a request's final one
};

// `requests` concurrent greedy requests with distinct prompts, request i asking for
// base_tokens + i % spread tokens (EOS ignored). Every request must end with kLength within 60 s.
inline GreedyBatch run_greedy_batch(runtime::Engine& engine, int requests, int base_tokens,
                                    int spread) {
  std::mutex mu;
  std::condition_variable cv;
  GreedyBatch batch;
  batch.tokens.resize(size_t(requests));
  std::vector<bool> finished(size_t(requests), false);
  int done = 0;
  for (int i = 0; i < requests; ++i) {
    runtime::SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = base_tokens + i % spread;
    sp.ignore_eos = true;
    const std::vector<int32_t> prompt = {3, 14, 15, 92, int32_t(10 + i), int32_t(40 + 3 * i)};
    engine.submit(prompt, sp, [&, i](const runtime::RequestOutput& o) {
      std::lock_guard lock(mu);
      if (finished[size_t(i)]) batch.finish_was_last = false;
      auto& t = batch.tokens[size_t(i)];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finish) {
        EXPECT_EQ(*o.finish, runtime::FinishReason::kLength);
        finished[size_t(i)] = true;
        ++done;
      }
      cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == requests; }));
  return batch;
}

}  // namespace serval::testing
