#include "runtime/data_parallel_engine.h"

#include "runtime/engine_loader.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "base/log.h"

namespace serval::runtime {

int least_loaded(std::span<const int64_t> loads) {
  return int(std::min_element(loads.begin(), loads.end()) - loads.begin());
}

DataParallelEngine::DataParallelEngine(std::vector<std::unique_ptr<Engine>> replicas)
    : replicas_(std::move(replicas)), loads_(replicas_.size(), 0) {
  if (replicas_.empty()) throw InvalidArgument("data parallel engine: no replicas");
  info_ = replicas_[0]->info();
  info_.kv_cache_tokens = 0;
  for (const auto& r : replicas_) info_.kv_cache_tokens += r->info().kv_cache_tokens;
}

DataParallelEngine::~DataParallelEngine() {
  shutdown();
}

uint64_t DataParallelEngine::submit(std::vector<int32_t> prompt, const SamplingParams& params,
                                    OutputCallback on_output) {
  Entry e;
  e.prompt_load = int64_t(prompt.size());
  e.output_load = std::max(0, params.max_tokens);
  uint64_t id;
  {
    std::lock_guard lock(mu_);
    e.replica = least_loaded(loads_);
    id = ++next_id_;
    loads_[size_t(e.replica)] += e.prompt_load + e.output_load;
    requests_.emplace(id, e);
  }
  uint64_t local;
  try {
    local = replicas_[size_t(e.replica)]->submit(
        std::move(prompt), params, [this, id, user = std::move(on_output)](const RequestOutput& o) {
          on_replica_output(id, o, user);
        });
  } catch (...) {
    std::lock_guard lock(mu_);
    if (auto it = requests_.find(id); it != requests_.end()) {
      loads_[size_t(e.replica)] -= it->second.prompt_load + it->second.output_load;
      requests_.erase(it);
    }
    throw;
  }
  bool abort_now = false;
  {
    std::lock_guard lock(mu_);
    if (auto it = requests_.find(id); it != requests_.end()) {
      it->second.local_id = local;
      abort_now = it->second.abort_requested;
    }
  }
  if (abort_now) replicas_[size_t(e.replica)]->abort(local);
  return id;
}

void DataParallelEngine::on_replica_output(uint64_t id, const RequestOutput& o,
                                           const OutputCallback& user) {
  {
    std::lock_guard lock(mu_);
    if (auto it = requests_.find(id); it != requests_.end()) {
      Entry& e = it->second;
      int64_t done = e.prompt_load;  // every output follows the prefill
      e.prompt_load = 0;
      const int64_t generated = std::min<int64_t>(e.output_load, int64_t(o.new_token_ids.size()));
      done += generated;
      e.output_load -= generated;
      if (o.finish) {
        done += e.output_load;
        loads_[size_t(e.replica)] -= done;
        requests_.erase(it);
      } else {
        loads_[size_t(e.replica)] -= done;
      }
    }
  }
  RequestOutput out = o;
  out.request_id = id;
  user(out);
}

void DataParallelEngine::abort(uint64_t id) {
  int replica;
  uint64_t local;
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    if (it->second.local_id == 0) {
      it->second.abort_requested = true;  // submit() aborts it once the replica's id is known
      return;
    }
    replica = it->second.replica;
    local = it->second.local_id;
  }
  replicas_[size_t(replica)]->abort(local);
}

EngineStats DataParallelEngine::stats() const {
  EngineStats sum;
  for (const EngineStats& s : replica_stats()) {
    sum.num_running += s.num_running;
    sum.num_waiting += s.num_waiting;
    sum.num_free_blocks += s.num_free_blocks;
    sum.num_total_blocks += s.num_total_blocks;
    sum.prompt_tokens_total += s.prompt_tokens_total;
    sum.generation_tokens_total += s.generation_tokens_total;
    sum.prefix_cache_queries += s.prefix_cache_queries;
    sum.prefix_cache_hits += s.prefix_cache_hits;
    sum.num_preemptions += s.num_preemptions;
    sum.steps_total += s.steps_total;
    sum.step_seconds_total += s.step_seconds_total;
    sum.model_seconds_total += s.model_seconds_total;
    sum.spec_decode_num_drafts += s.spec_decode_num_drafts;
    sum.spec_decode_num_draft_tokens += s.spec_decode_num_draft_tokens;
    sum.spec_decode_num_accepted_tokens += s.spec_decode_num_accepted_tokens;
  }
  return sum;
}

std::vector<EngineStats> DataParallelEngine::replica_stats() const {
  std::vector<EngineStats> out;
  out.reserve(replicas_.size());
  for (const auto& r : replicas_) out.push_back(r->stats());
  return out;
}

bool DataParallelEngine::healthy() const {
  return std::all_of(replicas_.begin(), replicas_.end(),
                     [](const auto& r) { return r->healthy(); });
}

void DataParallelEngine::shutdown() {
  for (auto& r : replicas_) r->shutdown();
}

std::vector<int64_t> DataParallelEngine::loads() const {
  std::lock_guard lock(mu_);
  return loads_;
}

int DataParallelEngine::replica_of(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = requests_.find(id);
  return it == requests_.end() ? -1 : it->second.replica;
}

std::unique_ptr<Engine> make_data_parallel_engine(const EngineConfig& config) {
  const int dp = config.data_parallel_size;
  if (dp < 1) throw InvalidArgument(fmt::format("--data-parallel-size {}: must be >= 1", dp));
  const int tp = std::max(1, config.tensor_parallel_size);
  std::vector<std::unique_ptr<Engine>> replicas;
  if (dp > 1 && config.enable_expert_parallel) {
    // One group of dp · tp ranks: attention data-parallel, experts over all ranks.
    LoadedModel first = load_model(config);
    EngineConfig rc = config;
    rc.data_parallel_size = 1;
    for (int d = 1; d < dp; ++d) replicas.push_back(make_engine(rc, replica_model(first, d)));
    replicas.insert(replicas.begin(), make_engine(rc, std::move(first)));
    return std::make_unique<DataParallelEngine>(std::move(replicas));
  }
  for (int d = 0; d < dp; ++d) {
    EngineConfig rc = config;
    rc.data_parallel_size = 1;
    rc.first_device = config.first_device + d * tp;
    log::info("data parallel: loading replica {} of {} (GPUs {}..{} when on CUDA)", d, dp,
              rc.first_device, rc.first_device + tp - 1);
    replicas.push_back(Engine::create(rc));
  }
  return std::make_unique<DataParallelEngine>(std::move(replicas));
}

}  // namespace serval::runtime
