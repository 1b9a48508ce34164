#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "base/error.h"

namespace serval::sched {
namespace {

std::vector<int32_t> tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A fake model: appends one token to every chunk that samples and finishes a request when its
// outputs reach max_tokens.
class FakeEngine {
 public:
  explicit FakeEngine(const SchedulerConfig& c) : sched(c) {}

  Request* add(uint64_t id, std::vector<int32_t> prompt, int max_tokens) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->num_prompt_tokens = static_cast<int>(prompt.size());
    r->token_ids = std::move(prompt);
    r->max_tokens = max_tokens;
    sched.add_request(r.get());
    return (requests[id] = std::move(r)).get();
  }

  SchedulerOutput step() {
    SchedulerOutput out = sched.schedule();
    for (const ScheduledChunk& c : out.chunks) {
      if (!c.samples_token) continue;
      Request* r = c.request;
      r->token_ids.push_back(50000 + r->num_output_tokens());
      if (r->num_output_tokens() == r->max_tokens) sched.finish_request(r->id);
    }
    return out;
  }

  Scheduler sched;
  std::map<uint64_t, std::unique_ptr<Request>> requests;
};

// (request id, start, num_new_tokens) of each chunk.
std::vector<std::tuple<uint64_t, int, int>> summary(const SchedulerOutput& out) {
  std::vector<std::tuple<uint64_t, int, int>> s;
  for (const auto& c : out.chunks)
    s.emplace_back(c.request->id, c.start_position, c.num_new_tokens);
  return s;
}
using Chunks = std::vector<std::tuple<uint64_t, int, int>>;

SchedulerConfig config(int num_blocks, int block_size, int budget, int max_seqs = 256) {
  SchedulerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = num_blocks * block_size;
  return c;
}

TEST(Scheduler, AdmissionStopsAtMaxNumSeqs) {
  FakeEngine e(config(64, 16, 1000, /*max_seqs=*/2));
  for (uint64_t id = 1; id <= 3; ++id) e.add(id, tokens(10, 100 * id), 3);
  SchedulerOutput out = e.step();
  EXPECT_EQ(summary(out), (Chunks{{1, 0, 10}, {2, 0, 10}}));
  EXPECT_EQ(out.num_scheduled_tokens, 20);
  EXPECT_EQ(e.sched.num_running(), 2);
  EXPECT_EQ(e.sched.num_waiting(), 1);
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 10, 1}, {2, 10, 1}}));
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 11, 1}, {2, 11, 1}}));  // both finish: 3 outputs
  EXPECT_EQ(e.sched.num_running(), 0);
  EXPECT_EQ(summary(e.step()), (Chunks{{3, 0, 10}}));
}

TEST(Scheduler, TokenBudgetChunksTheLastAdmission) {
  FakeEngine e(config(64, 16, 25));
  for (uint64_t id = 1; id <= 3; ++id) e.add(id, tokens(10, 100 * id), 5);
  SchedulerOutput out = e.step();
  EXPECT_EQ(summary(out), (Chunks{{1, 0, 10}, {2, 0, 10}, {3, 0, 5}}));
  EXPECT_TRUE(out.chunks[0].samples_token);
  EXPECT_FALSE(out.chunks[2].samples_token);
  EXPECT_EQ(out.num_scheduled_tokens, 25);
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 10, 1}, {2, 10, 1}, {3, 5, 5}}));
}

TEST(Scheduler, WithoutChunkedPrefillAPromptWaitsForBudget) {
  SchedulerConfig c = config(64, 16, 25);
  c.enable_chunked_prefill = false;
  c.max_model_len = 25;
  FakeEngine e(c);
  for (uint64_t id = 1; id <= 3; ++id) e.add(id, tokens(10, 100 * id), 5);
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 0, 10}, {2, 0, 10}}));
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 10, 1}, {2, 10, 1}, {3, 0, 10}}));
  c.max_num_batched_tokens = 24;
  EXPECT_THROW(Scheduler{c}, InvalidArgument);
}

TEST(Scheduler, ChunkedPrefillOfALongPromptThenDecode) {
  FakeEngine e(config(64, 16, 64));
  Request* a = e.add(1, tokens(150, 0), 4);
  SchedulerOutput s1 = e.step(), s2 = e.step(), s3 = e.step();
  EXPECT_EQ(summary(s1), (Chunks{{1, 0, 64}}));
  EXPECT_EQ(summary(s2), (Chunks{{1, 64, 64}}));
  EXPECT_EQ(summary(s3), (Chunks{{1, 128, 22}}));
  EXPECT_FALSE(s1.chunks[0].samples_token || s2.chunks[0].samples_token);
  EXPECT_TRUE(s3.chunks[0].samples_token);
  EXPECT_EQ(a->num_output_tokens(), 1);
  // A second request arrives: the decode goes first, the new prompt takes the rest.
  e.add(2, tokens(100, 1000), 1);
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 150, 1}, {2, 0, 63}}));
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 151, 1}, {2, 63, 37}}));
  EXPECT_EQ(e.sched.num_running(), 1);  // request 2 finished after its single token
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 152, 1}}));
  EXPECT_EQ(a->status, RequestStatus::kFinished);
  EXPECT_EQ(a->num_output_tokens(), 4);
  EXPECT_TRUE(e.step().empty());
  EXPECT_EQ(e.sched.kv().num_free_blocks(), 64);
}

TEST(Scheduler, BlockTableCoversComputedTokens) {
  FakeEngine e(config(64, 16, 40));
  e.add(1, tokens(70, 0), 2);
  e.step();
  EXPECT_EQ(e.sched.block_table(1).size(), 3u);  // 40 tokens
  e.step();
  EXPECT_EQ(e.sched.block_table(1).size(), 5u);  // 70 tokens
  EXPECT_TRUE(e.sched.block_table(99).empty());
}

TEST(Scheduler, ARequestWaitingForItsSampledTokenIsNotScheduled) {
  Scheduler s(config(8, 4, 100));
  Request r;
  r.id = 5;
  r.token_ids = tokens(6, 0);
  r.num_prompt_tokens = 6;
  s.add_request(&r);
  EXPECT_EQ(s.schedule().num_scheduled_tokens, 6);
  EXPECT_TRUE(s.schedule().empty());  // the engine has not appended the sampled token
  r.token_ids.push_back(9);
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].start_position, 6);
  EXPECT_EQ(out.chunks[0].num_new_tokens, 1);
  EXPECT_TRUE(out.chunks[0].samples_token);
}

TEST(Scheduler, PreemptsTheLatestAdmissionWhenBlocksRunOut) {
  SchedulerConfig c = config(/*num_blocks=*/8, /*block_size=*/4, 100);
  c.enable_prefix_caching = false;
  FakeEngine e(c);
  Request* a = e.add(1, tokens(12, 0), 10);
  Request* b = e.add(2, tokens(12, 500), 10);
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 0, 12}, {2, 0, 12}}));  // 6 of 8 blocks
  for (int pos = 12; pos < 16; ++pos) {                            // 13..16 tokens: 4 blocks each
    EXPECT_EQ(summary(e.step()), (Chunks{{1, pos, 1}, {2, pos, 1}}));
  }
  EXPECT_EQ(e.sched.kv().num_free_blocks(), 0);
  // Token 17 of request 1 needs a fifth block: request 2 (admitted last) is preempted and
  // nobody is admitted in that step.
  SchedulerOutput s6 = e.step();
  EXPECT_EQ(summary(s6), (Chunks{{1, 16, 1}}));
  EXPECT_EQ(s6.preempted_ids, std::vector<uint64_t>{2});
  EXPECT_EQ(b->status, RequestStatus::kPreempted);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_EQ(b->num_preemptions, 1);
  EXPECT_EQ(e.sched.num_preemptions_total(), 1);
  EXPECT_EQ(e.sched.num_waiting(), 1);
  EXPECT_TRUE(e.sched.block_table(2).empty());
  // Request 2 needs 5 blocks for its 17 tokens; only 3 are free until request 1 finishes.
  for (int pos = 17; pos < 21; ++pos) EXPECT_EQ(summary(e.step()), (Chunks{{1, pos, 1}}));
  EXPECT_EQ(a->status, RequestStatus::kFinished);
  EXPECT_EQ(a->num_output_tokens(), 10);
  // Recompute: prompt and the 5 generated tokens in one chunk, then it samples its 6th.
  SchedulerOutput s11 = e.step();
  EXPECT_EQ(summary(s11), (Chunks{{2, 0, 17}}));
  EXPECT_TRUE(s11.chunks[0].samples_token);
  for (int pos = 17; pos < 21; ++pos) EXPECT_EQ(summary(e.step()), (Chunks{{2, pos, 1}}));
  EXPECT_EQ(b->status, RequestStatus::kFinished);
  EXPECT_EQ(b->num_output_tokens(), 10);
  EXPECT_EQ(b->num_cached_tokens, 0);
  EXPECT_EQ(e.sched.kv().num_free_blocks(), 8);
}

TEST(Scheduler, TheLatestAdmissionPreemptsItselfAndTheLoopStops) {
  SchedulerConfig c = config(/*num_blocks=*/4, /*block_size=*/4, 100);
  c.enable_prefix_caching = false;
  FakeEngine e(c);
  Request* a = e.add(1, tokens(6, 0), 5);  // grows within its 2 blocks until 8 tokens
  Request* b = e.add(2, tokens(8, 100), 5);
  e.add(3, tokens(1, 200), 5);
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 0, 6}, {2, 0, 8}}));
  // Request 2 needs a third block and is itself the latest admission: it is preempted, and
  // request 3 (1 block would be free) is not admitted in a step that preempted.
  SchedulerOutput out = e.step();
  EXPECT_EQ(summary(out), (Chunks{{1, 6, 1}}));
  EXPECT_EQ(out.preempted_ids, std::vector<uint64_t>{2});
  EXPECT_EQ(b->status, RequestStatus::kPreempted);
  EXPECT_EQ(e.sched.num_waiting(), 2);
  EXPECT_EQ(e.sched.kv().num_free_blocks(), 2);
  // Next step: request 2 (front of the queue, 9 tokens = 3 blocks) does not fit; FCFS holds 3.
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 7, 1}}));
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 8, 1}}));  // request 1 takes a third block
  EXPECT_EQ(summary(e.step()), (Chunks{{1, 9, 1}}));  // its 5th output: finished
  EXPECT_EQ(a->status, RequestStatus::kFinished);
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 0, 9}, {3, 0, 1}}));
}

TEST(Scheduler, PrefixHitsSkipCachedBlocks) {
  FakeEngine e(config(64, 16, 1000));
  const auto prompt = tokens(48, 7);
  Request* a = e.add(1, prompt, 1);
  e.step();
  EXPECT_EQ(a->num_cached_tokens, 0);
  // Same 48 tokens: 2 blocks (one token must be computed), the third block recomputed.
  Request* b = e.add(2, prompt, 1);
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 32, 16}}));
  EXPECT_EQ(b->num_cached_tokens, 32);
  // 49 tokens: all 3 blocks.
  auto longer = prompt;
  longer.push_back(3);
  Request* c = e.add(3, longer, 1);
  EXPECT_EQ(summary(e.step()), (Chunks{{3, 48, 1}}));
  EXPECT_EQ(c->num_cached_tokens, 48);
  // One token changed in the third block: only the first two hit.
  auto changed = longer;
  changed[40] = -5;
  Request* d = e.add(4, changed, 1);
  EXPECT_EQ(summary(e.step()), (Chunks{{4, 32, 17}}));
  EXPECT_EQ(d->num_cached_tokens, 32);
  EXPECT_EQ(e.sched.kv().prefix_queries(), 48 + 48 + 49 + 49);
  EXPECT_EQ(e.sched.kv().prefix_hits(), 0 + 32 + 48 + 32);
  EXPECT_EQ(e.sched.kv().num_free_blocks(), 64);
}

// A request that skips the prefix cache computes its whole prompt though its blocks are cached;
// its chunk cap limits its chunks (not the others') with chunked prefill.
TEST(Scheduler, SkipPrefixCacheAndChunkCap) {
  FakeEngine e(config(64, 16, 1000));
  const auto prompt = tokens(48, 7);
  e.add(1, prompt, 1);
  e.step();
  Request* b = e.add(2, prompt, 2);
  b->skip_prefix_cache = true;
  b->max_chunk_tokens = 20;
  e.add(3, tokens(30, 500), 1);
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 0, 20}, {3, 0, 30}}));
  EXPECT_EQ(b->num_cached_tokens, 0);
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 20, 20}}));
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 40, 8}}));
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 48, 1}}));  // decode
  EXPECT_EQ(e.sched.kv().num_free_blocks(), 64);
}

uint64_t constant_hash(uint64_t, std::span<const int32_t>) {
  return 1;
}

TEST(Scheduler, HashCollisionsAreCaughtByTokenComparison) {
  SchedulerConfig c = config(64, 16, 1000);
  c.block_hash_fn = constant_hash;
  FakeEngine e(c);
  e.add(1, tokens(40, 0), 1);
  e.step();
  Request* b = e.add(2, tokens(40, 1), 1);  // same hashes, other tokens
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 0, 40}}));
  EXPECT_EQ(b->num_cached_tokens, 0);
  Request* c3 = e.add(3, tokens(40, 0), 1);
  EXPECT_EQ(summary(e.step()), (Chunks{{3, 32, 8}}));
  EXPECT_EQ(c3->num_cached_tokens, 32);
}

TEST(Scheduler, AdmissionIsFcfsAndUndoesAFailedPrefixAttach) {
  FakeEngine e(config(/*num_blocks=*/6, /*block_size=*/4, 100));
  e.add(1, tokens(9, 0), 1);
  e.step();                      // request 1 done; its 2 full blocks stay cached
  e.add(2, tokens(16, 100), 4);  // 4 blocks
  e.add(3, tokens(9, 0), 4);     // would hit 2 cached blocks but needs 3; only 2 free (cached)
  e.add(4, tokens(2, 900), 4);   // would fit, but FCFS: no skipping
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 0, 16}}));
  EXPECT_EQ(e.sched.num_waiting(), 2);
  EXPECT_EQ(e.sched.kv().num_free_blocks(), 2);
  EXPECT_EQ(e.sched.kv().prefix_queries(), 9 + 16);  // the failed attempt was taken back
  e.sched.abort_request(2);
  EXPECT_EQ(summary(e.step()), (Chunks{{3, 8, 1}, {4, 0, 2}}));
}

// --scheduling-policy priority: admission by (priority, arrival), lower first; when blocks run
// out the lowest-priority running request is preempted and waits at its priority's place.
TEST(Scheduler, PriorityPolicyAdmitsAndPreemptsByPriority) {
  SchedulerConfig c = config(/*num_blocks=*/16, /*block_size=*/4, 100, /*max_seqs=*/2);
  c.enable_prefix_caching = false;
  c.policy = SchedulingPolicy::kPriority;
  FakeEngine e(c);
  const auto add = [&](uint64_t id, int prompt_len, int priority) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->token_ids = tokens(prompt_len, int32_t(100 * id));
    r->num_prompt_tokens = prompt_len;
    r->max_tokens = 10;
    r->priority = priority;
    e.sched.add_request(r.get());
    return (e.requests[id] = std::move(r)).get();
  };
  add(1, 12, 5);
  Request* urgent = add(2, 12, -1);
  urgent->max_tokens = 20;
  add(3, 4, 5);  // same priority as 1, later: after it
  add(4, 4, 0);
  // Admitted: 2 (-1), then 4 (0); 1 and 3 wait. The running order is the priority order.
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 0, 12}, {4, 0, 4}}));
  ASSERT_EQ(e.sched.num_running(), 2);
  EXPECT_EQ(e.sched.running()[0]->id, 2u);
  // Request 4's ten tokens finish while 2 decodes; then 1 is admitted before 3.
  for (int pos = 4; pos < 13; ++pos)
    EXPECT_EQ(summary(e.step()), (Chunks{{2, pos + 8, 1}, {4, pos, 1}}));
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 21, 1}, {1, 0, 12}}));
  EXPECT_EQ(e.sched.num_waiting(), 1);
  EXPECT_EQ(urgent->status, RequestStatus::kRunning);
}

TEST(Scheduler, PriorityPolicyPreemptsTheLowestPriority) {
  SchedulerConfig c = config(/*num_blocks=*/8, /*block_size=*/4, 100);
  c.enable_prefix_caching = false;
  c.policy = SchedulingPolicy::kPriority;
  FakeEngine e(c);
  Request* low = e.add(1, tokens(12, 0), 10);
  e.requests[1]->priority = 0;
  // Request 2 arrives later with a higher priority: under fcfs it would be the victim.
  auto high = std::make_unique<Request>();
  high->id = 2;
  high->token_ids = tokens(12, 500);
  high->num_prompt_tokens = 12;
  high->max_tokens = 10;
  high->priority = -3;
  e.sched.add_request(high.get());
  e.requests[2] = std::move(high);
  EXPECT_EQ(summary(e.step()), (Chunks{{2, 0, 12}, {1, 0, 12}}));  // 6 of 8 blocks
  for (int pos = 12; pos < 16; ++pos)
    EXPECT_EQ(summary(e.step()), (Chunks{{2, pos, 1}, {1, pos, 1}}));
  // Both need a fifth block: request 1 (priority 0) is preempted, not the later request 2.
  SchedulerOutput out = e.step();
  EXPECT_EQ(summary(out), (Chunks{{2, 16, 1}}));
  EXPECT_EQ(out.preempted_ids, std::vector<uint64_t>{1});
  EXPECT_EQ(low->status, RequestStatus::kPreempted);
}

TEST(Scheduler, AbortFreesBlocksInEveryState) {
  FakeEngine e(config(16, 4, 10));
  e.add(1, tokens(4, 0), 100);   // will be decoding
  e.add(2, tokens(30, 100), 5);  // will be mid-prefill
  e.add(3, tokens(4, 200), 5);   // will be waiting
  e.step();
  e.step();
  EXPECT_EQ(e.sched.num_running(), 2);
  EXPECT_EQ(e.sched.num_waiting(), 1);
  EXPECT_LT(e.requests[2]->num_computed_tokens, 30);
  EXPECT_GT(e.requests[2]->num_computed_tokens, 0);
  const int free_before = e.sched.kv().num_free_blocks();
  e.sched.abort_request(2);
  EXPECT_EQ(e.sched.kv().num_free_blocks(), free_before + 4);  // 14 tokens held: 4 blocks
  EXPECT_EQ(e.requests[2]->status, RequestStatus::kFinished);
  e.sched.abort_request(3);
  e.sched.abort_request(1);
  e.sched.abort_request(12345);  // unknown: no-op
  EXPECT_THROW(e.sched.finish_request(1), InvalidArgument);
  EXPECT_EQ(e.sched.num_running() + e.sched.num_waiting(), 0);
  EXPECT_EQ(e.sched.kv().num_free_blocks(), 16);
  EXPECT_TRUE(e.step().empty());
}

TEST(Scheduler, RejectsBadConfigsAndRequests) {
  EXPECT_THROW(Scheduler{config(0, 16, 100)}, InvalidArgument);
  SchedulerConfig small = config(4, 16, 100);
  small.max_model_len = 65;  // the pool holds 64 tokens
  EXPECT_THROW(Scheduler{small}, InvalidArgument);
  Scheduler s(config(4, 16, 100));
  Request empty;
  EXPECT_THROW(s.add_request(&empty), InvalidArgument);
  Request too_long;
  too_long.token_ids = tokens(65, 0);
  EXPECT_THROW(s.add_request(&too_long), InvalidArgument);
  Request ok;
  ok.id = 1;
  ok.token_ids = tokens(3, 0);
  s.add_request(&ok);
  EXPECT_THROW(s.add_request(&ok), InvalidArgument);
}

}  // namespace
}  // namespace serval::sched
