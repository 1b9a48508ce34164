// Where a model's weights come from: a safetensors checkpoint or random dummy values, and how
// its linear weights are quantized.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"
#include "quant/quant_config.h"
#include "quant/weight_names.h"
#include "tensor/tensor.h"

namespace serval::model {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  // The host tensor `name`, which must have `shape`; LoadError names the tensor otherwise.
  // Checkpoint tensors keep their stored dtype; dummy tensors are created in the model dtype.
  virtual Tensor get(const std::string& name, const Shape& shape) const = 0;
  // The host tensor e.name, whose (dtype, shape) must be one of e's accepted combinations
  // (LoadError naming the tensor otherwise). Dummy tensors take e's first dtype and shape, with
  // values fit for the tensor's role in a quantized linear (see make_dummy_weights).
  virtual Tensor get_expected(const quant::ExpectedTensor& e) const = 0;
  // Every tensor name the source holds (empty for dummy weights, which make any name up).
  virtual std::vector<std::string> names() const { return {}; }
  // The host tensor `name` as stored, any dtype and shape; LoadError if the source has none.
  virtual Tensor get_stored(const std::string& name) const;
  // --load-format dummy: every tensor is random and made up on demand, so a backend that
  // generates weights on its device (Backend::generates_dummy_weights) can be handed the
  // descriptions below instead of host tensors.
  virtual bool is_dummy() const { return false; }
  // Dummy sources: the description of get(name, shape) (same dtype and values): shape viewed
  // as [numel / last dim, last dim], one block at offset 0. LoadError for other sources.
  virtual backend::DummyDense dummy_dense(const std::string& name, const Shape& shape) const;
  // Dummy sources: the random codes and scales of the quantized linear (or expert stack)
  // `name`, a name of the loaded weight (fused or stacked: keys derive from it), in the
  // statistics get_expected gives a single linear; meta holds one global_scale and
  // input_scale (multipliers) and nothing else. LoadError for other sources.
  virtual backend::DummyQuantized dummy_quantized(const std::string& name) const;
  // How the linear weights are quantized (Method::kNone: all dense).
  const quant::QuantConfig& quant_config() const { return quant_; }
  // --nvfp4-activations: NVFP4 linears loaded from here quantize their inputs too (W4A4).
  // InvalidArgument unless the checkpoint is NVFP4 with static input scales.
  void enable_nvfp4_activations();

 protected:
  quant::QuantConfig quant_;
};

// Reads the model folder's safetensors (single or sharded) through mmap, and its quantization
// description (quant::load_quant_config).
std::unique_ptr<WeightSource> open_checkpoint_weights(const std::string& model_dir);
// Random values (uniform with std 0.02; norms near 1) of the right shapes, deterministic per
// name and seed. Quantized linears (per `quant`) get random codes with scales that give the
// dequantized weights a std near 0.02: NVFP4 codes uniform over the 16 values, E4M3 block
// scales in [256, 448], weight_scale_2 chosen to match; FP8 values uniform in ±448 before
// rounding to E4M3, scales 0.02 / std. Activation scales are 1.
std::unique_ptr<WeightSource> make_dummy_weights(DType dtype, uint64_t seed,
                                                 const quant::QuantConfig& quant = {});

}  // namespace serval::model
