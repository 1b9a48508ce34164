#include "sched/scheduler.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace serval::sched {
namespace {

const SchedulerConfig& validated(const SchedulerConfig& c) {
  auto fail = [](const std::string& what) { throw InvalidArgument("SchedulerConfig: " + what); };
  if (c.block_size <= 0) fail("block_size must be positive, got " + std::to_string(c.block_size));
  if (c.num_blocks <= 0) fail("num_blocks must be positive, got " + std::to_string(c.num_blocks));
  if (c.max_num_seqs <= 0) fail("max_num_seqs must be positive");
  if (c.max_num_batched_tokens <= 0) fail("max_num_batched_tokens must be positive");
  if (c.max_model_len <= 0) fail("max_model_len must be positive");
  // A request that can never get its blocks would sit at the head of the FCFS queue forever.
  if (static_cast<int64_t>(c.num_blocks) * c.block_size < c.max_model_len) {
    fail("the KV cache holds " + std::to_string(int64_t{c.num_blocks} * c.block_size) +
         " tokens (" + std::to_string(c.num_blocks) + " blocks of " + std::to_string(c.block_size) +
         "), less than max_model_len " + std::to_string(c.max_model_len) +
         "; lower max_model_len or enlarge the KV cache");
  }
  if (!c.enable_chunked_prefill && c.max_num_batched_tokens < c.max_model_len) {
    fail("without chunked prefill max_num_batched_tokens (" +
         std::to_string(c.max_num_batched_tokens) + ") must be at least max_model_len (" +
         std::to_string(c.max_model_len) + ")");
  }
  return c;
}

// Tokens of a request's next chunk: what remains, within the step budget and (chunked) its cap.
int chunk_tokens(const Request& r, int remaining, int budget, bool chunked) {
  const int want = std::min(remaining, budget);
  return chunked && r.max_chunk_tokens > 0 ? std::min(want, r.max_chunk_tokens) : want;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(validated(config)),
      kv_(config.num_blocks, config.block_size, config.enable_prefix_caching,
          config.block_hash_fn) {}

void Scheduler::add_request(Request* request) {
  const std::string where = "request " + std::to_string(request->id);
  if (request->token_ids.empty()) throw InvalidArgument(where + " has no tokens");
  if (request->num_tokens() > config_.max_model_len) {
    throw InvalidArgument(where + " has " + std::to_string(request->num_tokens()) +
                          " tokens, more than max_model_len " +
                          std::to_string(config_.max_model_len));
  }
  if (!requests_.emplace(request->id, request).second) {
    throw InvalidArgument(where + " is already queued");
  }
  request->num_computed_tokens = 0;
  request->num_cached_tokens = -1;
  request->status = RequestStatus::kWaiting;
  request->arrival_seq = next_arrival_seq_++;
  add_waiting(request);
}

bool Scheduler::served_before(const Request* a, const Request* b) {
  return std::pair(a->priority, a->arrival_seq) < std::pair(b->priority, b->arrival_seq);
}

void Scheduler::add_waiting(Request* r) {
  if (config_.policy == SchedulingPolicy::kFcfs) return waiting_.push_back(r);
  waiting_.insert(std::ranges::upper_bound(waiting_, r, served_before), r);
}

void Scheduler::add_running(Request* r) {
  if (config_.policy == SchedulingPolicy::kFcfs) return running_.push_back(r);
  running_.insert(std::ranges::upper_bound(running_, r, served_before), r);
}

void Scheduler::cache_known_blocks(const Request* r) {
  // Blocks holding a pending token are hashed later, once its value is known.
  const int known = r->num_tokens() - r->num_pending_tokens;
  kv_.cache_computed(r->id, std::span<const int32_t>(r->token_ids).first(size_t(known)),
                     std::min(r->num_computed_tokens, known));
}

void Scheduler::schedule_chunk(Request* r, int num_new_tokens, SchedulerOutput& out) {
  const int start = r->num_computed_tokens;
  r->num_computed_tokens += num_new_tokens;
  cache_known_blocks(r);
  out.chunks.push_back({r, start, num_new_tokens, r->num_computed_tokens == r->num_tokens()});
  out.num_scheduled_tokens += num_new_tokens;
}

void Scheduler::preempt_last_running(SchedulerOutput& out) {
  Request* victim = running_.back();
  running_.pop_back();
  kv_.free(victim->id);
  victim->num_computed_tokens = 0;
  victim->status = RequestStatus::kPreempted;
  ++victim->num_preemptions;
  ++num_preemptions_total_;
  if (config_.policy == SchedulingPolicy::kFcfs)
    waiting_.push_front(victim);
  else
    add_waiting(victim);
  out.preempted_ids.push_back(victim->id);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;
  const bool chunked = config_.enable_chunked_prefill;

  // Running requests, oldest admission first. Victims are taken from the back, so requests
  // already scheduled this step (at lower indices) are never preempted.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const int remaining = r->num_tokens() - r->num_computed_tokens;
    const int want = chunk_tokens(*r, remaining, budget, chunked);
    if (remaining == 0 || (!chunked && want < remaining)) {
      ++i;
      continue;
    }
    bool preempted_self = false;
    while (!kv_.allocate(r->id, r->num_computed_tokens + want)) {
      preempted_self = running_.back() == r;
      preempt_last_running(out);
      if (preempted_self) break;
    }
    if (preempted_self) break;
    schedule_chunk(r, want, out);
    budget -= want;
    ++i;
  }

  // Admissions in queue order: the first request that does not fit stops admission.
  if (!out.preempted_ids.empty()) return out;
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Request* r = waiting_.front();
    const int cached = r->skip_prefix_cache ? 0 : kv_.match_prefix(r->id, r->token_ids);
    const int remaining = r->num_tokens() - cached;
    const int want = chunk_tokens(*r, remaining, budget, chunked);
    if ((!chunked && want < remaining) || !kv_.allocate(r->id, cached + want)) {
      kv_.undo_match_prefix(r->id);
      break;
    }
    waiting_.pop_front();
    if (r->num_cached_tokens < 0) r->num_cached_tokens = cached;
    r->num_computed_tokens = cached;
    r->status = RequestStatus::kRunning;
    add_running(r);
    schedule_chunk(r, want, out);
    budget -= want;
  }
  return out;
}

Request* Scheduler::remove(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return nullptr;
  Request* r = it->second;
  requests_.erase(it);
  if (auto pos = std::find(running_.begin(), running_.end(), r); pos != running_.end()) {
    running_.erase(pos);
  } else if (auto wpos = std::find(waiting_.begin(), waiting_.end(), r); wpos != waiting_.end()) {
    waiting_.erase(wpos);
  }
  kv_.free(request_id);
  r->status = RequestStatus::kFinished;
  return r;
}

void Scheduler::finish_request(uint64_t request_id) {
  // A block whose last token was pending when it was scheduled is hashed now, its tokens known
  // (its KV is written by a step queued before any that could reuse it).
  if (auto it = requests_.find(request_id); it != requests_.end()) cache_known_blocks(it->second);
  if (remove(request_id) == nullptr) {
    throw InvalidArgument("finish_request: request " + std::to_string(request_id) +
                          " is not queued");
  }
}

void Scheduler::abort_request(uint64_t request_id) {
  remove(request_id);
}

}  // namespace serval::sched
