// Data parallel with expert parallel in one process: dp_size replicas of tp_size ranks each. A
// replica's attention and dense layers run on its own ranks over its own KV cache and requests
// (its own engine); every MoE layer runs on all replicas' rows at once, the experts split over
// all dp_size · tp_size ranks (model::ShardSpec::dp_moe). So each step is a step of every
// replica: dp_ep_replica(group, d) is the StepRunner of replica d's engine; its execute() runs one
// joint step for every replica that has submitted one by then (a replica that arrives while a step
// runs joins the next; none ever waits for an idle one). A replica without work in a joint step
// takes a one-token dummy step on its reserved KV block (the last one, which its engine never
// sees: it is given num_blocks() − 1 blocks) and its logits are dropped.
#pragma once
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/parallel_runner.h"

namespace serval::runtime {

class DpEpGroup {
 public:
  // ranks: the dp_size · tp_size ranks of `parallel` (load_parallel_runner), rank r being
  // replica r / tp_size; num_blocks: KV blocks of every rank.
  DpEpGroup(std::unique_ptr<ParallelRunner> ranks, const dist::ParallelConfig& parallel,
            int num_blocks);

  // Rank 0 of replica d (its model, KV cache and block size stand for the replica).
  ModelRunner& first_rank(int d);
  // KV blocks a replica's engine may use (one fewer than each rank holds).
  int engine_blocks() const { return num_blocks_ - 1; }
  int dp_size() const { return parallel_.dp_size; }

  // Replica d's step, run jointly with the others' (see above): its logits [rows, vocab].
  std::vector<float> step(int d, std::span<const SeqChunk> chunks);

 private:
  struct Pending {
    std::span<const SeqChunk> chunks;
    std::vector<float> logits;
    std::exception_ptr error;
    bool done = false;
  };
  // One step of every replica: the submitted chunks, or the dummy step.
  void run_joint(const std::vector<Pending*>& batch);

  std::unique_ptr<ParallelRunner> ranks_;
  dist::ParallelConfig parallel_;
  int num_blocks_;
  std::vector<int32_t> dummy_tokens_{0}, dummy_table_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;
  std::vector<Pending*> pending_;  // [dp_size]: the step replica d waits for, or null
};

// Replica d's runner; it shares ownership of the group (the group lives while any replica does).
std::unique_ptr<StepRunner> dp_ep_replica(std::shared_ptr<DpEpGroup> group, int d);

}  // namespace serval::runtime
