// The Model interface: one forward over a batch of scheduled tokens, returning logits.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "dist/layout.h"
#include "io/model_config.h"
#include "model/weight_source.h"

namespace serval::model {

// KV cache geometry the runner allocates for a model.
struct KvGeometry {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0;
  // False: one cache tensor per layer (KvCacheLayer::k; MLA's latent rows), no value cache.
  bool values = true;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual KvGeometry kv_geometry() const = 0;
  // Runs the batch; returns logits [meta.num_logits, vocab] in float32 on the backend's device.
  virtual Tensor forward(const backend::StepMetadata& meta,
                         std::vector<backend::KvCacheLayer>& kv_cache) = 0;
  // MoE expert backend in effect ("" for dense models).
  virtual std::string moe_backend() const { return ""; }
};

// Which part of the model this rank loads (dist/layout.h) and the communicator its partial
// outputs are combined over. The default is the whole model on one rank.
//   tensor parallel (parallel.tp_size > 1): q/k/v and gate/up column-parallel, o and down
//     row-parallel with an all-reduce, KV heads split (replicated when fewer than ranks), the LM
//     head vocab-parallel with a gather of the logits, each MoE expert's intermediate split. The
//     embedding table is replicated (it is a lookup: no compute to save, and it keeps the first
//     layer free of a collective).
//   expert parallel (parallel.enable_expert_parallel): experts split over all world_size()
//     ranks, each whole; the MoE output is all-reduced.
// The communicator spans all world_size() ranks, so tp_size > 1 needs dp_size == 1 (a TP group
// per DP replica would need sub-communicators); dp_size > 1 with tp_size == 1 replicates
// attention and dense MLPs, which is how expert parallel without tensor parallel runs.
// Quantized checkpoints load under expert parallel (whole experts) but not yet under tensor
// parallel (LoadError).
struct ShardSpec {
  dist::ParallelConfig parallel;
  dist::RankCoord coord;
  // Not owned. comm: the rank's tensor-parallel group (with dp_size 1 also the expert-parallel
  // group); required when world_size() > 1. dp_comm: all dp_size · tp_size ranks, for the MoE
  // layers of data parallel with expert parallel (dp_moe()).
  backend::Communicator* comm = nullptr;
  backend::Communicator* dp_comm = nullptr;
  // True: the dp_size replicas run their own requests (attention data-parallel) and share the
  // MoE layers (runtime/dp_ep_group.h). False: every rank runs the same tokens, dp_size only
  // widening expert parallel.
  bool dp_attention = false;
  dist::TpLayout tp() const { return {coord.tp_rank, parallel.tp_size}; }
  // Every MoE layer gathers all replicas' rows over dp_comm, runs this rank's experts on them
  // and combines over dp_comm.
  bool dp_moe() const {
    return dp_attention && parallel.dp_size > 1 && parallel.enable_expert_parallel;
  }
  // A MoE block's output is a partial sum to all-reduce over comm (dp_moe combines its own).
  bool moe_all_reduce() const {
    if (dp_moe()) return false;
    return parallel.tp_size > 1 || (parallel.enable_expert_parallel && parallel.world_size() > 1);
  }
};

struct LoadOptions {
  std::string moe_backend = "latency";
  ShardSpec shard;
  // --runner pooling (embeddings): forward returns the final hidden states (after the final
  // norm, fp32) of the logits rows, [num_logits, hidden], instead of their logits.
  bool pooling = false;
};

// Builds the architecture named by config.architecture (see registry.cpp). Throws LoadError for
// unknown architectures (listing the known ones) and missing tensors.
std::unique_ptr<Model> create_model(const io::ModelConfig& config, const WeightSource& weights,
                                    backend::Backend& backend, const LoadOptions& options);

std::vector<std::string> known_architectures();

}  // namespace serval::model
