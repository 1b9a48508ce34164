// The Model interface: one forward over a batch of scheduled tokens, returning logits.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/weight_source.h"

namespace serval::model {

// KV cache geometry the runner allocates for a model.
struct KvGeometry {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0;
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

struct LoadOptions {
  std::string moe_backend = "latency";
};

// Builds the architecture named by config.architecture (see registry.cpp). Throws LoadError for
// unknown architectures (listing the known ones) and missing tensors.
std::unique_ptr<Model> create_model(const io::ModelConfig& config, const WeightSource& weights,
                                    backend::Backend& backend, const LoadOptions& options);

std::vector<std::string> known_architectures();

}  // namespace serval::model
