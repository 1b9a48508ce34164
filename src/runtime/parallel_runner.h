// ParallelRunner: the ranks of a tensor- / expert-parallel group in one process, one thread per
// rank, each with its own backend, model shard, KV cache and communicator. A step runs on all
// ranks at once; the collectives inside the forward keep them in lockstep.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "base/abortable_barrier.h"
#include "base/first_use_fence.h"
#include "dist/layout.h"
#include "model/weight_source.h"
#include "runtime/model_runner.h"

namespace serval::runtime {

class ParallelRunner final : public StepRunner {
 public:
  // ranks[r] runs rank r and its model holds a pointer to comms[r] (both owned here, comms
  // outliving the runners). bind(r), when set, runs first in rank r's thread on every step
  // (CUDA: makes GPU r current). Every rank receives the same chunks; rank 0's logits are
  // returned (the gathered logits are identical on all ranks).
  // group_comms: further communicators the ranks' models use (data parallel + expert parallel:
  // each replica's tensor-parallel group), owned and aborted with the others.
  ParallelRunner(std::vector<std::unique_ptr<backend::Communicator>> comms,
                 std::vector<std::unique_ptr<ModelRunner>> ranks,
                 std::function<void(int rank)> bind = {},
                 std::vector<std::unique_ptr<backend::Communicator>> group_comms = {});
  ~ParallelRunner() override;

  // If a rank throws, the group's communicators are aborted (so no rank waits forever), the
  // first exception is rethrown, and the runner is unusable afterwards.
  std::vector<float> execute(std::span<const SeqChunk> chunks) override;
  std::vector<int32_t> execute_greedy(std::span<const SeqChunk> chunks) override;
  // Token feedback when the ranks have it: every rank queues the step (pending ids resolve on
  // each rank from its own argmax of the same gathered logits) and every rank collects it; rank
  // 0's ids are returned.
  bool supports_token_feedback() const override { return ranks_[0]->supports_token_feedback(); }
  void launch_greedy(std::span<const SeqChunk> chunks) override;
  std::vector<int32_t> collect_greedy() override;
  int block_size() const override { return ranks_[0]->block_size(); }
  model::Model& model() override { return ranks_[0]->model(); }
  const std::vector<backend::KvCacheLayer>& kv_cache() const override {
    return ranks_[0]->kv_cache();
  }
  int size() const { return int(ranks_.size()); }
  ModelRunner& rank(int r) { return *ranks_.at(size_t(r)); }
  // Every rank runs its decode-graph warm-up alone (communicators local-only), then all capture
  // their decode CUDA graphs at once (their collectives run in that warm-up).
  void capture_decode_graphs();
  // Calls fn(r) for every rank at once, as a step does (rank 0 on the calling thread); a rank's
  // exception aborts the group's communicators and the first one is rethrown.
  void for_each_rank(const std::function<void(int rank)>& fn) { run_ranks(fn); }
  // Gives every rank a first-use fence (base/first_use_fence.h), its thread's during its part of
  // each call (run_ranks): a lazily loaded library kernel's first launch or a kernel attribute set
  // at a kernel's first launch waits until every rank's GPU has drained and every rank has
  // arrived, and no rank goes on before every rank is past it. Only for ranks that run the same
  // shapes in every step (not data-parallel replicas); before the steps.
  void fence_first_uses();
  // Makes every rank's pending and future collectives fail instead of waiting (a peer outside
  // this process is gone); the runner is unusable afterwards. Callable from any thread.
  void abort();
  // A step (or start-up phase) of all ranks that runs longer than `limit` is taken as stalled:
  // the group's communicators are aborted, which ends collectives waiting on a peer that never
  // comes, and the step throws serval::Error saying so. Default: SERVAL_PARALLEL_STALL_S
  // seconds, else 600; zero turns the watch off.
  void set_stall_limit(std::chrono::milliseconds limit);
  // Rank r's communicator (tests).
  backend::Communicator& comm(int r) { return *comms_.at(size_t(r)); }

 private:
  // Calls fn(r) for every rank concurrently: rank 0 on the calling thread, the others on the
  // persistent rank threads (a thread per step would add its start-up to every decode step).
  void run_ranks(const std::function<void(int rank)>& fn);
  void rank_thread(int r);
  // Every rank's Backend::activity, for the stall watch's error.
  std::string rank_activities();
  // Every communicator's local-only mode (backend::Communicator::set_local_only); between steps.
  void set_local_only(bool on);
  // Aborts the group when a run_ranks call outlives stall_limit_ (the watch thread).
  void watch();

  std::vector<std::unique_ptr<backend::Communicator>> comms_, group_comms_;
  std::shared_ptr<AbortableBarrier> first_use_barrier_;           // fence_first_uses
  std::vector<std::unique_ptr<FirstUseFence>> first_use_fences_;  // one per rank
  std::vector<std::unique_ptr<ModelRunner>> ranks_;
  std::function<void(int)> bind_;
  // Work hand-off to ranks 1..N-1: a new `job_` is announced by bumping `generation_`; the
  // caller waits until `pending_` drops to 0.
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr first_error_;
  std::vector<std::thread> threads_;
  // The stall watch: armed while run_ranks runs, with the time it must end by.
  std::condition_variable watch_cv_;
  std::chrono::milliseconds stall_limit_;
  bool armed_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::thread watcher_;
};

// How to build the ranks of a parallel group.
struct ParallelLoadOptions {
  std::string device = "cpu";  // "cpu" (threads + in-process all-reduce) or "cuda" (NCCL)
  dist::ParallelConfig parallel;
  std::string moe_backend = "latency";
  bool pooling = false;  // model::LoadOptions::pooling
  int block_size = 16;
  RunnerOptions runner;  // cuda_graphs is ignored for now (see load_parallel_runner)
  // KV blocks of every rank, decided from rank 0's backend and model once the weights are
  // loaded (all ranks have the same geometry).
  std::function<int(backend::Backend& rank0, const model::Model& model0)> num_blocks;
  int first_device = 0;  // CUDA: rank r runs on GPU first_device + r (data-parallel replicas)
  // The dp_size replicas run their own requests and share the MoE layers (dp_ep_group.h; needs
  // expert parallel). False: every rank runs the same tokens.
  bool dp_attention = false;
  // Multi-node: this process holds global ranks [first_rank, first_rank + local_ranks) of
  // parallel.world_size() (0: all of them), joined by `make_comms` (called with the local
  // backends, in rank order) instead of the in-process NCCL / CPU communicators.
  int first_rank = 0, local_ranks = 0;
  std::function<std::vector<std::unique_ptr<backend::Communicator>>(
      std::span<backend::Backend* const>)>
      make_comms;
};

// One backend, model shard (model::ShardSpec) and ModelRunner per rank of options.parallel,
// and the communicators joining them. With dp_attention (data parallel + expert parallel, see
// dp_ep_group.h) the all-rank communicators serve the MoE layers and each replica's ranks get a
// tensor-parallel communicator of their own; decode graphs stay off (the rows of a step vary
// with every replica's batch). Ranks load one after another (CUDA: each after binding
// its GPU). InvalidArgument when the layout does not fit the model (dist::shard_*).
std::unique_ptr<ParallelRunner> load_parallel_runner(const io::ModelConfig& config,
                                                     const model::WeightSource& weights,
                                                     const ParallelLoadOptions& options);

}  // namespace serval::runtime
