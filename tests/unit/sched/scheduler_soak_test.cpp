// Randomized soak: many requests with shared prefixes, random lengths and aborts, a tight KV
// pool; every step checks the scheduler's invariants and simulates the KV contents to prove
// that every block a step reads holds the KV of exactly that request's tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "base/math.h"
#include "sched/scheduler.h"

namespace serval::sched {
namespace {

uint64_t mix(uint64_t h, int32_t t) {
  h ^= static_cast<uint32_t>(t) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}

// Keeps 4 bits of the real hash: most lookups collide and must be resolved by content.
uint64_t weak_hash(uint64_t parent, std::span<const int32_t> t) {
  return kv::hash_block_tokens(parent, t) & 0xF;
}

// Every block collides: only the stored tokens and the parent (id, generation) tell blocks apart.
uint64_t constant_hash(uint64_t, std::span<const int32_t>) {
  return 3;
}

struct SoakParams {
  int num_requests;
  bool prefix_caching;
  bool chunked_prefill;
  kv::BlockHashFn hash_fn;
  uint32_t seed;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;  // priority: random priorities in [-2, 2]
};

struct Live {
  std::unique_ptr<Request> request;
  std::vector<uint64_t> fingerprint;  // [num_tokens]: hash of token_ids[0..p]
};

class Soak {
 public:
  explicit Soak(const SoakParams& p) : p_(p), rng_(p.seed) {
    config_.block_size = 4;
    config_.num_blocks = 64;  // 256 tokens for up to 24 sequences of up to 120 tokens
    config_.max_model_len = 256;
    config_.max_num_seqs = 24;
    config_.max_num_batched_tokens = p.chunked_prefill ? 96 : 256;
    config_.enable_prefix_caching = p.prefix_caching;
    config_.enable_chunked_prefill = p.chunked_prefill;
    config_.block_hash_fn = p.hash_fn;
    config_.policy = p.policy;
    sched_ = std::make_unique<Scheduler>(config_);
    kv_content_.assign(static_cast<size_t>(config_.num_blocks) * config_.block_size, 0);
    for (auto& prefix : prefixes_) prefix = random_tokens(uniform(1, 48));
  }

  void run() {
    int submitted = 0;
    for (int step = 0; submitted < p_.num_requests || sched_->has_unfinished(); ++step) {
      ASSERT_LT(step, 40 * p_.num_requests) << "no progress";
      steps_ = step + 1;
      // Bursty arrivals, throttled so that the waiting queue stays around a few dozen.
      const int burst = sched_->num_waiting() < 40 ? uniform(0, 3) : 0;
      for (int n = burst; n > 0 && submitted < p_.num_requests; --n) add(submitted++);
      std::set<uint64_t> was_running;
      for (Request* r : sched_->running()) was_running.insert(r->id);
      SchedulerOutput out = sched_->schedule();
      check_output(out, was_running);
      if (testing::Test::HasFatalFailure()) return;
      check_blocks();
      if (testing::Test::HasFatalFailure()) return;
      simulate_kv(out);
      if (testing::Test::HasFatalFailure()) return;
      append_tokens(out);
      if (uniform(0, 99) < 4 && !live_.empty()) abort_random();
    }
    EXPECT_EQ(finished_ + aborted_, p_.num_requests);
    EXPECT_GT(aborted_, 0);
    EXPECT_EQ(sched_->kv().num_free_blocks(), sched_->kv().num_total_blocks());
    EXPECT_EQ(sched_->num_running() + sched_->num_waiting(), 0);
    EXPECT_EQ(sched_->kv().prefix_hits() > 0, p_.prefix_caching);
    EXPECT_GT(sched_->num_preemptions_total(), 0);
    std::printf(
        "%d requests (%d aborted) in %d steps, %lld preemptions, %lld/%lld prefix tokens hit\n",
        p_.num_requests, aborted_, steps_, static_cast<long long>(sched_->num_preemptions_total()),
        static_cast<long long>(sched_->kv().prefix_hits()),
        static_cast<long long>(sched_->kv().prefix_queries()));
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::vector<int32_t> random_tokens(int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = uniform(0, 7);  // a tiny vocabulary: equal blocks happen by chance
    return t;
  }

  void add(int index) {
    Live l;
    l.request = std::make_unique<Request>();
    Request& r = *l.request;
    r.id = 1000 + static_cast<uint64_t>(index);
    if (uniform(0, 9) < 7) r.token_ids = prefixes_[uniform(0, kNumPrefixes - 1)];
    auto suffix = random_tokens(uniform(r.token_ids.empty() ? 1 : 0, 32));
    r.token_ids.insert(r.token_ids.end(), suffix.begin(), suffix.end());
    r.num_prompt_tokens = r.num_tokens();
    r.max_tokens = uniform(1, 40);
    if (p_.policy == SchedulingPolicy::kPriority) r.priority = uniform(-2, 2);
    for (int32_t t : r.token_ids) push_fingerprint(l, t);
    sched_->add_request(&r);
    live_.emplace(r.id, std::move(l));
  }

  static void push_fingerprint(Live& l, int32_t token) {
    l.fingerprint.push_back(mix(l.fingerprint.empty() ? 17 : l.fingerprint.back(), token));
  }

  void check_output(const SchedulerOutput& out, const std::set<uint64_t>& was_running) {
    ASSERT_TRUE(!sched_->has_unfinished() || !out.empty()) << "a step scheduled nothing";
    int total = 0;
    bool admissions_started = false;
    std::set<uint64_t> seen;
    for (const ScheduledChunk& c : out.chunks) {
      const Request& r = *c.request;
      ASSERT_TRUE(seen.insert(r.id).second) << "request " << r.id << " scheduled twice";
      ASSERT_EQ(r.status, RequestStatus::kRunning);
      ASSERT_GT(c.num_new_tokens, 0);
      ASSERT_EQ(c.start_position + c.num_new_tokens, r.num_computed_tokens);
      ASSERT_LE(r.num_computed_tokens, r.num_tokens());
      ASSERT_EQ(c.samples_token, r.num_computed_tokens == r.num_tokens());
      ASSERT_TRUE(p_.chunked_prefill || c.samples_token) << "a chunk without chunked prefill";
      const bool admitted = !was_running.contains(r.id);
      ASSERT_FALSE(admissions_started && !admitted) << "running chunk after an admission";
      admissions_started |= admitted;
      ASSERT_GE(static_cast<int>(sched_->block_table(r.id).size()),
                ceil_div(r.num_computed_tokens, config_.block_size));
      total += c.num_new_tokens;
    }
    ASSERT_EQ(total, out.num_scheduled_tokens);
    ASSERT_LE(total, config_.max_num_batched_tokens);
    ASSERT_LE(sched_->num_running(), config_.max_num_seqs);
    ASSERT_TRUE(out.preempted_ids.empty() || !admissions_started) << "admitted after preempting";
    for (uint64_t id : out.preempted_ids) {
      const Request& r = *live_.at(id).request;
      ASSERT_EQ(r.status, RequestStatus::kPreempted);
      ASSERT_EQ(r.num_computed_tokens, 0);
      ASSERT_FALSE(seen.contains(id));
    }
    if (p_.policy == SchedulingPolicy::kPriority) check_priority_order(out, was_running);
  }

  // Priority: the running requests stay in (priority, arrival) order, and a request preempted in
  // a step comes after every running request the step served.
  void check_priority_order(const SchedulerOutput& out, const std::set<uint64_t>& was_running) {
    const auto key = [](const Request& r) { return std::pair(r.priority, r.arrival_seq); };
    const auto running = sched_->running();
    for (size_t i = 1; i < running.size(); ++i)
      ASSERT_LT(key(*running[i - 1]), key(*running[i])) << "running requests out of order";
    for (uint64_t id : out.preempted_ids)
      for (const ScheduledChunk& c : out.chunks)
        if (was_running.contains(c.request->id))
          ASSERT_LT(key(*c.request), key(*live_.at(id).request))
              << "request " << id << " preempted before a lower priority";
  }

  // Every block's ref count equals the number of live block tables holding it; a block in two
  // tables sits at the same index in both and is a prefix-cache block.
  void check_blocks() {
    const kv::BlockPool& pool = sched_->kv().pool();
    std::vector<int> holders(config_.num_blocks, 0), index(config_.num_blocks, -1);
    for (const auto& [id, l] : live_) {
      const Request& r = *l.request;
      const auto& table = sched_->block_table(id);
      if (r.status != RequestStatus::kRunning) {
        ASSERT_TRUE(table.empty()) << "waiting request " << id << " holds blocks";
        continue;
      }
      std::set<int32_t> distinct(table.begin(), table.end());
      ASSERT_EQ(distinct.size(), table.size()) << "request " << id << " holds a block twice";
      for (int i = 0; i < static_cast<int>(table.size()); ++i) {
        int32_t b = table[i];
        if (holders[b]++ > 0) {
          ASSERT_EQ(index[b], i) << "block " << b << " shared at different positions";
          ASSERT_TRUE(pool.is_cached(b)) << "block " << b << " shared but not cached";
          ASSERT_LE((i + 1) * config_.block_size, r.num_computed_tokens);
        }
        index[b] = i;
      }
    }
    int free_blocks = 0;
    for (int b = 0; b < config_.num_blocks; ++b) {
      ASSERT_EQ(pool.ref_count(b), holders[b]) << "block " << b;
      free_blocks += holders[b] == 0;
    }
    ASSERT_EQ(free_blocks, sched_->kv().num_free_blocks());
  }

  // The step writes the KV of every scheduled token, then each chunk reads its whole prefix.
  void simulate_kv(const SchedulerOutput& out) {
    const int bs = config_.block_size;
    auto slot = [&](const std::vector<int32_t>& table, int pos) {
      return static_cast<size_t>(table[pos / bs]) * bs + pos % bs;
    };
    for (const ScheduledChunk& c : out.chunks) {
      const auto& table = sched_->block_table(c.request->id);
      const auto& fp = live_.at(c.request->id).fingerprint;
      for (int pos = c.start_position; pos < c.start_position + c.num_new_tokens; ++pos) {
        kv_content_[slot(table, pos)] = fp[pos];
      }
    }
    for (const ScheduledChunk& c : out.chunks) {
      const auto& table = sched_->block_table(c.request->id);
      const auto& fp = live_.at(c.request->id).fingerprint;
      for (int pos = 0; pos < c.start_position + c.num_new_tokens; ++pos) {
        ASSERT_EQ(kv_content_[slot(table, pos)], fp[pos])
            << "request " << c.request->id << " reads wrong KV at position " << pos;
      }
    }
  }

  void append_tokens(const SchedulerOutput& out) {
    for (const ScheduledChunk& c : out.chunks) {
      if (!c.samples_token) continue;
      Live& l = live_.at(c.request->id);
      Request& r = *l.request;
      int32_t t = uniform(0, 7);
      r.token_ids.push_back(t);
      push_fingerprint(l, t);
      if (r.num_output_tokens() == r.max_tokens) {
        sched_->finish_request(r.id);
        EXPECT_EQ(r.status, RequestStatus::kFinished);
        ++finished_;
        live_.erase(r.id);
      }
    }
  }

  void abort_random() {
    auto it = std::next(live_.begin(), uniform(0, static_cast<int>(live_.size()) - 1));
    EXPECT_LT(it->second.request->num_output_tokens(), it->second.request->max_tokens);
    sched_->abort_request(it->first);
    ++aborted_;
    live_.erase(it);
  }

  static constexpr int kNumPrefixes = 8;
  SoakParams p_;
  std::mt19937 rng_;
  SchedulerConfig config_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<uint64_t> kv_content_;  // [num_blocks * block_size]: fingerprint of each slot
  std::vector<int32_t> prefixes_[kNumPrefixes];
  std::map<uint64_t, Live> live_;
  int finished_ = 0, aborted_ = 0, steps_ = 0;
};

TEST(SchedulerSoak, TenThousandRequestsWithPrefixCaching) {
  Soak({10000, true, true, kv::hash_block_tokens, 1}).run();
}

TEST(SchedulerSoak, CollidingHashes) {
  Soak({2000, true, true, weak_hash, 2}).run();
  Soak({2000, true, true, constant_hash, 5}).run();
}

TEST(SchedulerSoak, WithoutChunkedPrefill) {
  Soak({2000, true, false, kv::hash_block_tokens, 3}).run();
}

TEST(SchedulerSoak, PriorityScheduling) {
  Soak({3000, true, true, kv::hash_block_tokens, 6, SchedulingPolicy::kPriority}).run();
  Soak({1000, false, false, kv::hash_block_tokens, 7, SchedulingPolicy::kPriority}).run();
}

TEST(SchedulerSoak, WithoutPrefixCaching) {
  Soak({2000, false, true, kv::hash_block_tokens, 4}).run();
}

}  // namespace
}  // namespace serval::sched
