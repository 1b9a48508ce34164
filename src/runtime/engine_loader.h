// Start-up of an engine: config, weights, backend choice, memory check, KV cache sizing.
#pragma once
#include <memory>
#include <string>

#include "io/model_config.h"
#include "runtime/dp_ep_group.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"

namespace serval::runtime {

struct LoadedModel {
  io::ModelConfig config;
  std::unique_ptr<StepRunner> runner;  // a ModelRunner, or a ParallelRunner when tp/ep > 1
  int num_blocks = 0;
  int max_model_len = 0;
  std::string moe_backend;
  std::string device;
  std::string dtype;
  std::string kv_cache_dtype;   // storage type of the KV cache
  int num_kv_scale_layers = 0;  // layers whose k/v scales came from the checkpoint
  // Data parallel with expert parallel (data_parallel_size > 1 and enable_expert_parallel): the
  // group all replicas step through; `runner` is replica 0's, dp_ep_replica(group, d) the
  // others' (each replica's engine gets num_blocks blocks: the group keeps one more per rank).
  std::shared_ptr<DpEpGroup> dp_ep_group;
};

// --kv-cache-dtype → storage type: auto = the backend's own; fp8 = fp8_e4m3.
// InvalidArgument lists the choices, or says the backend cannot store that type for this
// head_dim (the CUDA fp8 kernels cover 64 and 128; 0: no such limit, MLA's kernels).
DType resolve_kv_cache_dtype(const std::string& flag, const backend::Backend& backend,
                             int head_dim);

// Resolves --moe-backend → SERVAL_MOE_BACKEND → "latency"; InvalidArgument listing the choices.
std::string resolve_moe_backend(const std::string& flag);

// Loads the model per `config`; throws LoadError / OutOfResources with clear messages (the
// latter states the parameter count and the memory needed). data_parallel_size > 1 is loaded
// here only with enable_expert_parallel (one group for all replicas, see dp_ep_group.h); plain
// data parallel loads a model per replica (data_parallel_engine.h).
LoadedModel load_model(const EngineConfig& config);

// Replica d's share of a data parallel + expert parallel load (first.dp_ep_group set): the same
// description, replica d's runner.
LoadedModel replica_model(const LoadedModel& first, int d);

// An engine over `loaded` (config.data_parallel_size is taken as 1: this is one replica).
std::unique_ptr<Engine> make_engine(const EngineConfig& config, LoadedModel loaded);

}  // namespace serval::runtime
