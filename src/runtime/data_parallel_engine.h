// DataParallelEngine: N engine replicas behind one Engine interface. Each request goes to the
// replica with the least outstanding work; request ids are global and route aborts back to the
// replica that holds the request.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/engine.h"

namespace serval::runtime {

// Index of the smallest load; ties go to the lowest index. `loads` must not be empty.
int least_loaded(std::span<const int64_t> loads);

class DataParallelEngine final : public Engine {
 public:
  // Takes ownership of the replicas (at least one, all serving the same model). info() is
  // replica 0's with kv_cache_tokens summed over all replicas.
  explicit DataParallelEngine(std::vector<std::unique_ptr<Engine>> replicas);
  ~DataParallelEngine() override;

  const ModelInfo& info() const override { return info_; }
  const tokenizer::Tokenizer* tokenizer() const override { return replicas_[0]->tokenizer(); }
  const tokenizer::ChatTemplate* chat_template() const override {
    return replicas_[0]->chat_template();
  }

  // Load of a request = prompt tokens not yet computed + output tokens not yet generated. The
  // prompt part is released with the first output (the prefill is done by then), one token per
  // generated token, and the rest when the request finishes.
  uint64_t submit(std::vector<int32_t> prompt_token_ids, const SamplingParams& params,
                  OutputCallback on_output) override;
  void abort(uint64_t request_id) override;

  EngineStats stats() const override;  // sums over the replicas
  std::vector<EngineStats> replica_stats() const override;
  bool healthy() const override;
  void shutdown() override;

  int num_replicas() const { return int(replicas_.size()); }
  // Outstanding load of each replica in tokens (see submit).
  std::vector<int64_t> loads() const;
  // The replica holding request `id`, or -1 once it finished (or never existed).
  int replica_of(uint64_t request_id) const;

 private:
  struct Entry {
    int replica = 0;
    uint64_t local_id = 0;  // 0 until the replica's submit returned
    int64_t prompt_load = 0;
    int64_t output_load = 0;
    bool abort_requested = false;  // abort() came before local_id was known
  };
  void on_replica_output(uint64_t global_id, const RequestOutput& o, const OutputCallback& user);

  std::vector<std::unique_ptr<Engine>> replicas_;
  ModelInfo info_;
  mutable std::mutex mu_;  // guards the fields below
  std::vector<int64_t> loads_;
  std::unordered_map<uint64_t, Entry> requests_;  // live requests by global id
  uint64_t next_id_ = 0;
};

// Builds `config.data_parallel_size` replicas: via Engine::create (each with
// data_parallel_size 1 and first_device = replica * tensor_parallel_size), or, with expert
// parallel, as engines over one group of all replicas' ranks (dp_ep_group.h: attention
// data-parallel, experts split over every rank). InvalidArgument for a size < 1.
std::unique_ptr<Engine> make_data_parallel_engine(const EngineConfig& config);

}  // namespace serval::runtime
