// The continuous-batching scheduler: one token budget per step shared by decodes, chunked
// prefills and new admissions; preemption by recompute when KV blocks run out.
#pragma once
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/request.h"
#include "sched/scheduler_output.h"

namespace serval::sched {

// fcfs: requests are admitted in arrival order and the most recently admitted is preempted first.
// priority: by (Request::priority, arrival), lower first: the waiting queue is kept in that order
// and so are the running requests, so that a step serves the highest priorities first and
// preempts the lowest (vLLM's --scheduling-policy).
enum class SchedulingPolicy { kFcfs, kPriority };

struct SchedulerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;  // token budget per step
  int max_model_len = 4096;           // the engine stops requests at this length
  int num_blocks = 0;                 // KV blocks in the pool; must hold max_model_len tokens
  int block_size = 16;
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  kv::BlockHashFn block_hash_fn = kv::hash_block_tokens;  // tests inject weak hashes
};

// The one invariant: each step, every running request (in order: admission, or priority) advances
// by min(num_tokens - num_computed_tokens, remaining budget) tokens; then waiting requests are
// admitted in queue order. Prefill, chunked prefill, prefix hits and recompute after preemption
// are all that one case. When blocks run out, the last running request is preempted (blocks
// freed, num_computed_tokens = 0, back to the waiting queue: at its front under fcfs, at its
// place under priority) and the allocation retried; a step that preempted admits nobody (the
// freed blocks go to running requests first).
// Not thread-safe: the engine loop owns it.
class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  // Queues a request (not owned; the engine keeps it alive until finish_request or
  // abort_request). Resets its scheduling state. Throws InvalidArgument for an empty or
  // duplicate request or one longer than max_model_len.
  void add_request(Request* request);

  // Builds the next step. Advances each scheduled request's num_computed_tokens by its
  // num_new_tokens and registers newly-full blocks in the prefix cache (a block holding a pending
  // token at a later step, once the token is known). KV is written by the step that follows,
  // which the engine always runs; the runner must write a layer's KV for the whole batch before
  // attention reads it, since a request admitted this step may share a block another request
  // fills this step.
  SchedulerOutput schedule();

  // Removes a finished request (after the engine appended its last token) and frees its
  // blocks, first registering the full blocks it computed that are not cached yet. Throws
  // InvalidArgument for unknown ids.
  void finish_request(uint64_t request_id);
  // Removes a waiting or running request and frees its blocks; no-op for unknown ids.
  void abort_request(uint64_t request_id);

  const std::vector<int32_t>& block_table(uint64_t request_id) const {
    return kv_.block_table(request_id);
  }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  bool has_unfinished() const { return !requests_.empty(); }
  const kv::KvCacheManager& kv() const { return kv_; }
  kv::KvCacheManager& kv() { return kv_; }
  int64_t num_preemptions_total() const { return num_preemptions_total_; }
  const SchedulerConfig& config() const { return config_; }
  // Running requests in admission order (priority: in priority order).
  std::span<Request* const> running() const { return running_; }

 private:
  void schedule_chunk(Request* r, int num_new_tokens, SchedulerOutput& out);
  // Registers r's newly full blocks of known tokens and computed (or scheduled) KV.
  void cache_known_blocks(const Request* r);
  void preempt_last_running(SchedulerOutput& out);
  // Whether `a` is served before `b` under the priority policy.
  static bool served_before(const Request* a, const Request* b);
  void add_waiting(Request* r);          // at the queue's back (fcfs) or at its priority's place
  void add_running(Request* r);          // likewise
  Request* remove(uint64_t request_id);  // from running or waiting; nullptr when unknown

  SchedulerConfig config_;
  kv::KvCacheManager kv_;
  std::vector<Request*> running_;  // admission order (priority: served_before order)
  std::deque<Request*> waiting_;   // arrival order, preempted requests at the front (priority:
                                   // served_before order)
  std::unordered_map<uint64_t, Request*> requests_;  // every waiting or running request
  int64_t num_preemptions_total_ = 0;
  uint64_t next_arrival_seq_ = 0;
};

}  // namespace serval::sched
