// The scheduler's view of one request: its tokens and how many of them have KV.
#pragma once
#include <cstdint>
#include <vector>

namespace serval::sched {

enum class RequestStatus { kWaiting, kRunning, kPreempted, kFinished };

// Owned by the engine; the scheduler holds a pointer from add_request until finish_request or
// abort_request.
struct Request {
  uint64_t id = 0;
  std::vector<int32_t> token_ids;  // prompt, then generated tokens as the engine appends them
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;  // tokens whose KV is written (or scheduled this step)
  int num_cached_tokens = -1;   // prompt tokens served by the prefix cache at first admission
                                // (-1 until admitted)
  int max_tokens = 16;          // the engine finishes the request; the scheduler only reads it
  double arrival_time = 0;
  // --scheduling-policy priority: lower values are served first (vLLM's `priority`), ties by
  // arrival; ignored under fcfs.
  int priority = 0;
  uint64_t arrival_seq = 0;  // set by Scheduler::add_request: the order requests arrived in
  RequestStatus status = RequestStatus::kWaiting;
  int num_preemptions = 0;
  // The last tokens of token_ids that are placeholders for ids still on the device (async
  // scheduling: runtime::StepRunner::launch_greedy); their KV may be scheduled, not hashed.
  int num_pending_tokens = 0;
  bool skip_prefix_cache = false;  // compute every prompt position (prompt logprobs need them)
  // > 0: at most this many tokens per step with chunked prefill (a step's logits rows of every
  // position stay within memory); 0: the step budget alone.
  int max_chunk_tokens = 0;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
};

}  // namespace serval::sched
