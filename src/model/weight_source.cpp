#include "model/weight_source.h"

#include <cstring>

#include "base/error.h"
#include "base/thread_pool.h"
#include "io/safetensors.h"

namespace serval::model {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

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
    const uint64_t key = seed_ ^ std::hash<std::string>{}(name);
    // Uniform values with the std of the usual init (0.02; norms 1 ± 0.05), from a counter-based
    // hash so that any element can be made independently, in parallel.
    const bool is_norm = shape.size() == 1;
    const float center = is_norm ? 1.0f : 0.0f;
    const float half_width = (is_norm ? 0.05f : 0.02f) * 1.7320508f;
    ThreadPool::global().parallel_for(t.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float u = float(splitmix64(key + uint64_t(i)) >> 40) * (1.0f / float(1 << 24));
        const float v = center + (2.0f * u - 1.0f) * half_width;
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
    });
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
