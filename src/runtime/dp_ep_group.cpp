#include "runtime/dp_ep_group.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace serval::runtime {

namespace {

// Replica d's view of the group.
class ReplicaRunner final : public StepRunner {
 public:
  ReplicaRunner(std::shared_ptr<DpEpGroup> group, int d)
      : group_(std::move(group)), d_(d), rank_(group_->first_rank(d)) {}
  std::vector<float> execute(std::span<const SeqChunk> chunks) override {
    return group_->step(d_, chunks);
  }
  // The logits come to the host anyway (they are this replica's rows of a joint step).
  std::vector<int32_t> execute_greedy(std::span<const SeqChunk> chunks) override {
    const std::vector<float> logits = execute(chunks);
    const size_t vocab = size_t(rank_.model().config().vocab_size);
    std::vector<int32_t> ids;
    for (size_t row = 0; row * vocab < logits.size(); ++row) {
      const auto begin = logits.begin() + std::ptrdiff_t(row * vocab);
      ids.push_back(int32_t(std::max_element(begin, begin + std::ptrdiff_t(vocab)) - begin));
    }
    return ids;
  }
  int block_size() const override { return rank_.block_size(); }
  model::Model& model() override { return rank_.model(); }
  const std::vector<backend::KvCacheLayer>& kv_cache() const override { return rank_.kv_cache(); }

 private:
  std::shared_ptr<DpEpGroup> group_;
  int d_;
  ModelRunner& rank_;
};

}  // namespace

DpEpGroup::DpEpGroup(std::unique_ptr<ParallelRunner> ranks, const dist::ParallelConfig& parallel,
                     int num_blocks)
    : ranks_(std::move(ranks)),
      parallel_(parallel),
      num_blocks_(num_blocks),
      dummy_table_{num_blocks - 1},
      pending_(size_t(parallel.dp_size), nullptr) {
  check(ranks_ && ranks_->size() == parallel.world_size() && parallel.dp_size > 1 &&
            parallel.enable_expert_parallel,
        "DpEpGroup: dp_size > 1 replicas with expert parallel, all ranks in this process");
  if (num_blocks < 2)
    throw InvalidArgument("data parallel with expert parallel: " + std::to_string(num_blocks) +
                          " KV blocks per rank leave none for requests beside the reserved one");
}

ModelRunner& DpEpGroup::first_rank(int d) {
  check(d >= 0 && d < parallel_.dp_size, "DpEpGroup: no such replica");
  return ranks_->rank(dist::global_rank(parallel_, {d, 0}));
}

std::unique_ptr<StepRunner> dp_ep_replica(std::shared_ptr<DpEpGroup> group, int d) {
  check(group != nullptr && d >= 0 && d < group->dp_size(), "dp_ep_replica: no such replica");
  return std::make_unique<ReplicaRunner>(std::move(group), d);
}

std::vector<float> DpEpGroup::step(int d, std::span<const SeqChunk> chunks) {
  Pending me;
  me.chunks = chunks;
  std::unique_lock lock(mu_);
  check(pending_[size_t(d)] == nullptr, "DpEpGroup: replica submitted two steps at once");
  pending_[size_t(d)] = &me;
  while (!me.done) {
    if (running_) {
      cv_.wait(lock);
      continue;
    }
    // This thread runs the next joint step, for every replica waiting now.
    running_ = true;
    std::vector<Pending*> batch(pending_.size(), nullptr);
    std::swap(batch, pending_);
    lock.unlock();
    run_joint(batch);
    lock.lock();
    running_ = false;
    cv_.notify_all();
  }
  if (me.error) std::rethrow_exception(me.error);
  return std::move(me.logits);
}

void DpEpGroup::run_joint(const std::vector<Pending*>& batch) {
  const int dp = parallel_.dp_size;
  const SeqChunk dummy{dummy_tokens_, 0, 1, dummy_table_, SeqChunk::Logits::kLast};
  std::vector<std::span<const SeqChunk>> chunks(static_cast<size_t>(dp));
  std::vector<int> offset(size_t(dp) + 1, 0);
  for (int d = 0; d < dp; ++d) {
    chunks[size_t(d)] =
        batch[size_t(d)] ? batch[size_t(d)]->chunks : std::span<const SeqChunk>(&dummy, 1);
    int rows = 0;
    for (const SeqChunk& c : chunks[size_t(d)]) rows += c.num_new;
    offset[size_t(d) + 1] = offset[size_t(d)] + rows;
  }
  std::vector<std::vector<float>> logits(static_cast<size_t>(dp));
  std::exception_ptr error;
  try {
    ranks_->for_each_rank([&](int r) {
      const int d = dist::rank_coord(parallel_, r).dp_rank;
      ModelRunner& rank = ranks_->rank(r);
      rank.set_dp_rows(offset[size_t(d)], offset[size_t(dp)]);
      std::vector<float> out = rank.execute(chunks[size_t(d)]);
      if (dist::rank_coord(parallel_, r).tp_rank == 0) logits[size_t(d)] = std::move(out);
    });
  } catch (...) {
    error = std::current_exception();
  }
  for (int d = 0; d < dp; ++d) {
    Pending* p = batch[size_t(d)];
    if (!p) continue;
    p->error = error;
    if (!error) p->logits = std::move(logits[size_t(d)]);
    p->done = true;
  }
}

}  // namespace serval::runtime
