#include "runtime/parallel_runner.h"

#include <algorithm>
#include <exception>
#include <string>

#include "base/env.h"
#include "base/error.h"
#include "base/first_use_fence.h"
#include "base/log.h"
#include "model/model.h"

namespace serval::runtime {

ParallelRunner::ParallelRunner(std::vector<std::unique_ptr<backend::Communicator>> comms,
                               std::vector<std::unique_ptr<ModelRunner>> ranks,
                               std::function<void(int)> bind,
                               std::vector<std::unique_ptr<backend::Communicator>> group_comms)
    : comms_(std::move(comms)),
      group_comms_(std::move(group_comms)),
      ranks_(std::move(ranks)),
      bind_(std::move(bind)) {
  check(!ranks_.empty() && comms_.size() == ranks_.size(),
        "ParallelRunner: one communicator per rank");
  stall_limit_ = std::chrono::seconds(env_int("SERVAL_PARALLEL_STALL_S", 0, 1 << 30, 600));
  for (int r = 1; r < size(); ++r) threads_.emplace_back(&ParallelRunner::rank_thread, this, r);
  watcher_ = std::thread(&ParallelRunner::watch, this);
}

ParallelRunner::~ParallelRunner() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  watch_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  watcher_.join();
}

void ParallelRunner::set_stall_limit(std::chrono::milliseconds limit) {
  {
    std::lock_guard lock(mu_);
    stall_limit_ = limit;
  }
  // A shorter limit: the watch may be asleep until an older, later deadline.
  watch_cv_.notify_all();
}

// Steps only set armed_ and deadline_ (no wake-up: a decode step's host work stays as it was);
// the watch checks an idle runner once a second and otherwise sleeps until the deadline it saw,
// which is never later than a newer one while the limit stays (set_stall_limit wakes it).
void ParallelRunner::watch() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (!armed_) {
      watch_cv_.wait_for(lock, std::chrono::seconds(1));
      continue;
    }
    const auto deadline = deadline_;
    watch_cv_.wait_until(lock, deadline);  // notified only on stop
    // The same run_ranks call still running past its deadline (a later call re-armed with a
    // later one, or none is running: look again).
    if (stopping_ || !armed_ || deadline_ != deadline ||
        std::chrono::steady_clock::now() < deadline)
      continue;
    armed_ = false;
    if (!first_error_) {
      const int64_t ms = stall_limit_.count();
      const std::string limit =
          ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
      first_error_ = std::make_exception_ptr(
          Error("parallel step made no progress for " + limit +
                " (SERVAL_PARALLEL_STALL_S): a rank is waiting for a peer that does not come; "
                "the group's collectives were aborted; " +
                rank_activities()));
    }
    lock.unlock();
    abort();  // outside the lock: a rank thread's error path takes it
    lock.lock();
  }
}

std::string ParallelRunner::rank_activities() {
  std::string out = "where the ranks were:";
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const std::string a = ranks_[r]->backend().activity();
    out += " rank " + std::to_string(r) + " " + (a.empty() ? "between backend calls" : "in " + a) +
           (r + 1 < ranks_.size() ? ";" : "");
  }
  return out;
}

void ParallelRunner::rank_thread(int r) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
    }
    (*job)(r);
    {
      std::lock_guard lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ParallelRunner::run_ranks(const std::function<void(int)>& fn) {
  const std::function<void(int)> body = [&](int r) {
    // The rank's first-use fence is its thread's for the call (fence_first_uses).
    struct ThreadFence {
      explicit ThreadFence(FirstUseFence* f) { thread_first_use_fence() = f; }
      ~ThreadFence() { thread_first_use_fence() = nullptr; }
    } fence(first_use_fences_.empty() ? nullptr : first_use_fences_[size_t(r)].get());
    try {
      if (bind_) bind_(r);
      fn(r);
    } catch (...) {
      bool first = false;
      {
        std::lock_guard lock(mu_);
        first = !first_error_;
        if (first) first_error_ = std::current_exception();
      }
      // Release the ranks waiting on this one: NCCL aborts only the communicator it is given,
      // and a peer blocked in a collective waits on its own, so every rank's is aborted.
      if (first) abort();
    }
  };
  {
    std::lock_guard lock(mu_);
    job_ = &body;
    pending_ = size() - 1;
    first_error_ = nullptr;
    ++generation_;
    if (stall_limit_.count() > 0) {
      armed_ = true;
      deadline_ = std::chrono::steady_clock::now() + stall_limit_;
    }
  }
  work_cv_.notify_all();
  body(0);
  std::exception_ptr error;
  {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    armed_ = false;
    error = first_error_;
  }
  if (error) std::rethrow_exception(error);
}

void ParallelRunner::abort() {
  for (auto& comm : comms_) comm->abort();
  for (auto& comm : group_comms_) comm->abort();
  if (first_use_barrier_) first_use_barrier_->abort();
}

namespace {

// The first-use fence of one rank (base/first_use_fence.h): its GPU drained, then every rank;
// after the call, every rank again. Nothing while the rank captures a graph (nothing runs then,
// and a capturing stream cannot be synchronized); the ranks capture together, so they skip alike.
class RankFirstUseFence final : public FirstUseFence {
 public:
  RankFirstUseFence(backend::Backend& b, std::shared_ptr<AbortableBarrier> barrier)
      : b_(b), barrier_(std::move(barrier)) {}
  void before() override {
    if (b_.capturing()) return;
    b_.synchronize();
    barrier_->arrive_and_wait();
  }
  void after() override {
    if (!b_.capturing()) barrier_->arrive_and_wait();
  }

 private:
  backend::Backend& b_;
  std::shared_ptr<AbortableBarrier> barrier_;
};

}  // namespace

void ParallelRunner::fence_first_uses() {
  if (size() < 2 || first_use_barrier_) return;
  first_use_barrier_ = std::make_shared<AbortableBarrier>(size());
  for (auto& rank : ranks_)
    first_use_fences_.push_back(
        std::make_unique<RankFirstUseFence>(rank->backend(), first_use_barrier_));
}

// First every rank alone, its collectives local-only: each launches every kernel of its decode
// steps once while no GPU waits on another. A first launch may load its kernel (libraries may load
// lazily whatever CUDA_MODULE_LOADING says), and a load that waits for a device spinning in an
// all-reduce for a peer whose thread is blocked behind the same load deadlocks. Then the warm-up
// with collectives, drained on every rank before any rank captures, then the captures.
void ParallelRunner::capture_decode_graphs() {
  {
    struct LocalOnly {  // on for this scope, off however it ends
      ParallelRunner& runner;
      explicit LocalOnly(ParallelRunner& r) : runner(r) { runner.set_local_only(true); }
      ~LocalOnly() { runner.set_local_only(false); }
    } local_only(*this);
    run_ranks([&](int r) { ranks_[size_t(r)]->warm_up_decode_graphs(); });
  }
  run_ranks([&](int r) { ranks_[size_t(r)]->warm_up_decode_graphs(); });
  run_ranks([&](int r) { ranks_[size_t(r)]->capture_decode_graphs(); });
  // A capture that failed on one rank only would have that rank run the batch eagerly (or in a
  // larger bucket, with collectives of another size) while the others replay: every rank keeps
  // only the buckets all of them captured.
  std::vector<int> common = ranks_[0]->decode_graph_buckets();
  for (size_t r = 1; r < ranks_.size(); ++r) {
    const std::vector<int> mine = ranks_[r]->decode_graph_buckets();
    std::erase_if(common,
                  [&](int b) { return std::find(mine.begin(), mine.end(), b) == mine.end(); });
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const size_t before = ranks_[r]->decode_graph_buckets().size();
    ranks_[r]->keep_decode_graph_buckets(common);
    if (before != common.size())
      log::warn("rank {}: {} decode graphs dropped that another rank failed to capture", r,
                before - common.size());
  }
}

void ParallelRunner::set_local_only(bool on) {
  for (auto& comm : comms_) comm->set_local_only(on);
  for (auto& comm : group_comms_) comm->set_local_only(on);
}

std::vector<float> ParallelRunner::execute(std::span<const SeqChunk> chunks) {
  std::vector<float> out;
  run_ranks([&](int r) {
    if (r == 0) {
      out = ranks_[0]->execute(chunks);
    } else {
      // Other ranks only need to take part in the collectives; their argmax is the cheapest
      // way to finish the step.
      ranks_[size_t(r)]->execute_greedy(chunks);
    }
  });
  return out;
}

std::vector<int32_t> ParallelRunner::execute_greedy(std::span<const SeqChunk> chunks) {
  std::vector<int32_t> out;
  run_ranks([&](int r) {
    std::vector<int32_t> ids = ranks_[size_t(r)]->execute_greedy(chunks);
    if (r == 0) out = std::move(ids);
  });
  return out;
}

void ParallelRunner::launch_greedy(std::span<const SeqChunk> chunks) {
  run_ranks([&](int r) { ranks_[size_t(r)]->launch_greedy(chunks); });
}

std::vector<int32_t> ParallelRunner::collect_greedy() {
  std::vector<int32_t> out;
  run_ranks([&](int r) {
    std::vector<int32_t> ids = ranks_[size_t(r)]->collect_greedy();
    if (r == 0) out = std::move(ids);
  });
  return out;
}

std::unique_ptr<ParallelRunner> load_parallel_runner(const io::ModelConfig& config,
                                                     const model::WeightSource& weights,
                                                     const ParallelLoadOptions& options) {
  dist::validate(options.parallel);
  const int local = options.local_ranks > 0 ? options.local_ranks : options.parallel.world_size();
  if (options.first_rank < 0 || options.first_rank + local > options.parallel.world_size())
    throw InvalidArgument("parallel runner: local ranks " + std::to_string(options.first_rank) +
                          ".." + std::to_string(options.first_rank + local - 1) +
                          " are outside the group of " +
                          std::to_string(options.parallel.world_size()));
  const bool cuda = options.device == "cuda";
  if (!cuda && options.device != "cpu")
    throw InvalidArgument("parallel runner: unknown device '" + options.device +
                          "' (choices: cpu, cuda)");
  std::function<void(int)> bind;
  const int first = options.first_device;
  if (cuda) bind = [first](int r) { backend::bind_cuda_device(first + r); };

  std::vector<std::unique_ptr<backend::Backend>> backends;
  std::vector<backend::Backend*> raw;
  for (int r = 0; r < local; ++r) {
    if (bind) bind(r);
    backends.push_back(cuda ? backend::make_cuda_backend() : backend::make_cpu_backend());
    if (!backends.back())
      throw InvalidArgument("tensor parallel: no CUDA backend for GPU " +
                            std::to_string(first + r));
    raw.push_back(backends.back().get());
  }
  std::vector<std::unique_ptr<backend::Communicator>> comms =
      options.make_comms ? options.make_comms(raw)
      : cuda             ? backend::make_nccl_communicators(raw, first)
                         : backend::make_cpu_communicators(local);

  // Data parallel + expert parallel: comms join all ranks (the MoE layers); each replica's
  // ranks also get a tensor-parallel group of their own.
  const int dp = options.dp_attention ? options.parallel.dp_size : 1;
  const int tp = options.parallel.tp_size;
  std::vector<std::unique_ptr<backend::Communicator>> tp_comms;
  if (dp > 1) {
    if (local != options.parallel.world_size())
      throw InvalidArgument("data parallel with expert parallel runs in one process (local " +
                            std::to_string(local) + " of " +
                            std::to_string(options.parallel.world_size()) + " ranks)");
    for (int d = 0; d < dp && tp > 1; ++d) {
      std::vector<std::unique_ptr<backend::Communicator>> group =
          cuda ? backend::make_nccl_communicators(
                     std::span<backend::Backend* const>(raw).subspan(size_t(d * tp), size_t(tp)),
                     first + d * tp)
               : backend::make_cpu_communicators(tp);
      for (auto& c : group) tp_comms.push_back(std::move(c));
    }
  }
  std::vector<std::unique_ptr<model::Model>> models;
  for (int r = 0; r < local; ++r) {
    if (bind) bind(r);
    model::LoadOptions lo;
    lo.moe_backend = options.moe_backend;
    lo.pooling = options.pooling;
    lo.shard.parallel = options.parallel;
    lo.shard.coord = dist::rank_coord(options.parallel, options.first_rank + r);
    if (dp > 1) {
      lo.shard.dp_attention = true;
      lo.shard.dp_comm = comms[size_t(r)].get();
      lo.shard.comm = tp > 1 ? tp_comms[size_t(r)].get() : nullptr;
    } else {
      lo.shard.comm = comms[size_t(r)].get();
    }
    models.push_back(model::create_model(config, weights, *backends[size_t(r)], lo));
  }
  const int num_blocks = options.num_blocks(*backends[0], *models[0]);
  RunnerOptions ro = options.runner;
  if (dp > 1) ro.cuda_graphs = false;
  // The ranks capture their decode graphs together, after all of them are built, so that the
  // collectives of one rank's capture meet the other ranks' (capture_decode_graphs below).
  ro.defer_graph_capture = true;
  std::vector<std::unique_ptr<ModelRunner>> ranks;
  for (int r = 0; r < local; ++r) {
    if (bind) bind(r);
    ranks.push_back(std::make_unique<ModelRunner>(std::move(backends[size_t(r)]),
                                                  std::move(models[size_t(r)]), num_blocks,
                                                  options.block_size, ro));
  }
  auto runner = std::make_unique<ParallelRunner>(std::move(comms), std::move(ranks),
                                                 std::move(bind), std::move(tp_comms));
  // Data-parallel replicas run steps of different shapes: their first launches do not meet.
  if (dp == 1) runner->fence_first_uses();
  runner->capture_decode_graphs();
  return runner;
}

}  // namespace serval::runtime
