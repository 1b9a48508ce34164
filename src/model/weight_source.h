// Where a model's weights come from: a safetensors checkpoint or random dummy values.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "io/model_config.h"
#include "tensor/tensor.h"

namespace serval::model {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  // The host tensor `name`, which must have `shape`; LoadError names the tensor otherwise.
  // Checkpoint tensors keep their stored dtype; dummy tensors are created in the model dtype.
  virtual Tensor get(const std::string& name, const Shape& shape) const = 0;
};

// Reads the model folder's safetensors (single or sharded) through mmap.
std::unique_ptr<WeightSource> open_checkpoint_weights(const std::string& model_dir);
// Random values (uniform with std 0.02; norms near 1) of the right shapes, deterministic per
// name and seed.
std::unique_ptr<WeightSource> make_dummy_weights(DType dtype, uint64_t seed);

}  // namespace serval::model
