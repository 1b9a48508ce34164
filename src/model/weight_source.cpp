#include "model/weight_source.h"

#include <cstring>
#include <random>

#include "base/error.h"
#include "io/safetensors.h"

namespace serval::model {

namespace {

class CheckpointWeights final : public WeightSource {
 public:
  explicit CheckpointWeights(const std::string& dir)
      : dir_(dir), checkpoint_(io::Checkpoint::open(dir)) {}

  bool has(const std::string& name) const override { return checkpoint_->find(name) != nullptr; }

  Tensor get(const std::string& name, const Shape& shape) const override {
    const io::TensorInfo* info = checkpoint_->find(name);
    if (!info) throw LoadError(dir_ + ": the checkpoint has no tensor '" + name + "'");
    if (info->shape != shape) {
      throw LoadError(dir_ + ": tensor '" + name + "' has shape " + shape_str(info->shape) +
                      ", expected " + shape_str(shape));
    }
    return host_view(info->data, info->dtype, info->shape, checkpoint_);
  }

 private:
  std::string dir_;
  std::shared_ptr<io::Checkpoint> checkpoint_;
};

class DummyWeights final : public WeightSource {
 public:
  DummyWeights(DType dtype, uint64_t seed) : dtype_(dtype), seed_(seed) {}
  bool has(const std::string&) const override { return true; }

  Tensor get(const std::string& name, const Shape& shape) const override {
    Tensor t = host_empty(dtype_, shape);
    uint64_t h = seed_ ^ std::hash<std::string>{}(name);
    std::mt19937_64 rng(h);
    // Norm weights (1-D) near 1 keep activations in range; matrices get std 0.02.
    const bool is_norm = shape.size() == 1;
    std::normal_distribution<float> dist(is_norm ? 1.0f : 0.0f, is_norm ? 0.05f : 0.02f);
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) {
      float v = dist(rng);
      switch (dtype_) {
        case DType::kF32:
          t.as<float>()[i] = v;
          break;
        case DType::kBF16:
          t.as<bf16>()[i] = float_to_bf16(v);
          break;
        case DType::kF16:
          t.as<f16>()[i] = float_to_f16(v);
          break;
        default:
          throw Error("dummy weights: unsupported dtype");
      }
    }
    return t;
  }

 private:
  DType dtype_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<WeightSource> open_checkpoint_weights(const std::string& model_dir) {
  return std::make_unique<CheckpointWeights>(model_dir);
}

std::unique_ptr<WeightSource> make_dummy_weights(DType dtype, uint64_t seed) {
  return std::make_unique<DummyWeights>(dtype, seed);
}

}  // namespace serval::model
