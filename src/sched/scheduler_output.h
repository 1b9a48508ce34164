// What the scheduler hands the model runner for one step.
#pragma once
#include <cstdint>
#include <vector>

#include "sched/request.h"

namespace serval::sched {

struct ScheduledChunk {
  Request* request;
  int start_position;  // == request->num_computed_tokens before this step
  int num_new_tokens;  // tokens [start_position, start_position + num_new_tokens) run this step
  // True when this chunk reaches the end of token_ids: the engine samples one token for it.
  bool samples_token;
};

struct SchedulerOutput {
  // Running requests first (decodes and ongoing chunked prefills, in admission order), then
  // new admissions (FCFS).
  std::vector<ScheduledChunk> chunks;
  std::vector<uint64_t> preempted_ids;  // preempted this step (blocks freed, back to waiting)
  int num_scheduled_tokens = 0;         // sum of num_new_tokens
  bool empty() const { return chunks.empty(); }
};

}  // namespace serval::sched
