#include "model/weight_source.h"

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/thread_pool.h"
#include "io/safetensors.h"
#include "kernels/cpu/dummy_init.h"

namespace serval::model {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class CheckpointWeights final : public WeightSource {
 public:
  explicit CheckpointWeights(const std::string& dir)
      : dir_(dir), checkpoint_(io::Checkpoint::open(dir)) {
    quant_ = quant::load_quant_config(dir);
  }

  bool has(const std::string& name) const override { return checkpoint_->find(name) != nullptr; }
  std::vector<std::string> names() const override { return checkpoint_->names(); }
  Tensor get_stored(const std::string& name) const override {
    const io::TensorInfo& info = find(name);
    return host_view(info.data, info.dtype, info.shape, checkpoint_);
  }

  Tensor get(const std::string& name, const Shape& shape) const override {
    const io::TensorInfo& info = find(name);
    if (info.shape != shape) {
      throw LoadError(dir_ + ": tensor '" + name + "' has shape " + shape_str(info.shape) +
                      ", expected " + shape_str(shape));
    }
    return host_view(info.data, info.dtype, info.shape, checkpoint_);
  }

  Tensor get_expected(const quant::ExpectedTensor& e) const override {
    const io::TensorInfo& info = find(e.name);
    try {
      quant::check_tensor(e, info.dtype, info.shape);
    } catch (const LoadError& err) {
      throw LoadError(dir_ + ": " + err.what());
    }
    return host_view(info.data, info.dtype, info.shape, checkpoint_);
  }

 private:
  const io::TensorInfo& find(const std::string& name) const {
    const io::TensorInfo* info = checkpoint_->find(name);
    if (!info) throw LoadError(dir_ + ": the checkpoint has no tensor '" + name + "'");
    return *info;
  }

  std::string dir_;
  std::shared_ptr<io::Checkpoint> checkpoint_;
};

// Mean square of the E2M1 values when all 16 codes are equally likely:
// (0 + .25 + 1 + 2.25 + 4 + 9 + 16 + 36) / 8.
constexpr double kE2m1MeanSquare = 68.5 / 8;
constexpr float kDummyStd = 0.02f;
// Dummy NVFP4 block scales: the E4M3 codes of [256, 448] (exponent 8, mantissas 0..6).
constexpr uint8_t kSfCodeLo = 0x78, kSfCodeHi = 0x7E;

// Mean square of the dummy block-scale values.
double dummy_sf_mean_square() {
  double s = 0;
  for (int c = kSfCodeLo; c <= kSfCodeHi; ++c)
    s += double(e4m3_to_float(uint8_t(c))) * e4m3_to_float(uint8_t(c));
  return s / (kSfCodeHi - kSfCodeLo + 1);
}

class DummyWeights final : public WeightSource {
 public:
  DummyWeights(DType dtype, uint64_t seed, const quant::QuantConfig& quant)
      : dtype_(dtype), seed_(seed) {
    quant_ = quant;
  }
  bool has(const std::string&) const override { return true; }

  bool is_dummy() const override { return true; }

  Tensor get(const std::string& name, const Shape& shape) const override {
    Tensor t = host_empty(dtype_, shape);
    const backend::DummyDense d = dummy_dense(name, shape);
    const backend::DummyBlock& b = d.blocks.at(0);
    kernels::cpu::dummy_dense(t.data, dtype_, b.rows, d.cols, b.key, b.offset, b.row_stride,
                              b.center, b.half_width);
    return t;
  }

  // Uniform values with the std of the usual init (0.02; norms 1 ± 0.05), counter i for flat
  // element i.
  backend::DummyDense dummy_dense(const std::string& name, const Shape& shape) const override {
    const bool is_norm = shape.size() == 1;
    backend::DummyDense d;
    d.dtype = dtype_;
    d.shape = shape;
    d.cols = shape.empty() ? 1 : shape.back();
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    backend::DummyBlock b;
    b.rows = d.cols > 0 ? numel / d.cols : 0;
    b.key = key_of(name);
    b.row_stride = d.cols;
    b.center = is_norm ? 1.0f : 0.0f;
    b.half_width = (is_norm ? 0.05f : kDummyStd) * 1.7320508f;
    d.blocks.push_back(b);
    return d;
  }

  backend::DummyQuantized dummy_quantized(const std::string& name) const override {
    backend::DummyQuantized d;
    d.data_key = key_of(name + ".weight");
    d.scale_key = key_of(name + ".weight_scale");
    d.sf_code_lo = kSfCodeLo;
    d.sf_code_hi = kSfCodeHi;
    d.fp8_half_width = 448.0f;
    d.fp8_scale = scale_value(name + ".weight_scale");
    const bool nvfp4 = quant_.method == quant::QuantConfig::Method::kNvfp4;
    const bool per_tensor = nvfp4 || quant_.method == quant::QuantConfig::Method::kFp8PerTensor;
    // As read_linear converts the stored scalars (equal shards fuse to the same values).
    auto multiplier = [&](float stored) {
      return nvfp4 ? quant::nvfp4_scale_from_checkpoint(quant_, stored) : stored;
    };
    d.meta.global_scale = {
        per_tensor ? multiplier(scale_value(name + (nvfp4 ? ".weight_scale_2" : ".weight_scale")))
                   : 1.0f};
    d.meta.input_scale = {quant_.static_activations &&
                                  quant_.method != quant::QuantConfig::Method::kFp8Block
                              ? multiplier(scale_value(name + ".input_scale"))
                              : 1.0f};
    return d;
  }

  Tensor get_expected(const quant::ExpectedTensor& e) const override {
    const DType dtype = e.dtypes.at(0);
    const Shape& shape = e.shapes.at(0);
    Tensor t = host_empty(dtype, shape);
    const bool nvfp4 = quant_.method == quant::QuantConfig::Method::kNvfp4;
    if (dtype == DType::kU8) {  // packed NVFP4 codes: 16 codes per 64-bit hash, all equally likely
      kernels::cpu::dummy_bits(t.as<uint8_t>(), t.numel(), key_of(e.name));
    } else if (dtype == DType::kF8E4M3 && nvfp4) {  // NVFP4 block scales in [256, 448]
      kernels::cpu::dummy_codes(t.as<uint8_t>(), t.numel(), key_of(e.name), kSfCodeLo, kSfCodeHi);
    } else if (dtype == DType::kF8E4M3) {  // FP8 weights: uniform in ±448, std 448/sqrt(3)
      kernels::cpu::dummy_fp8(t.as<uint8_t>(), t.numel(), key_of(e.name), 448.0f);
    } else if (dtype == DType::kF32) {
      const float v = scale_value(e.name);
      for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = v;
    } else {
      throw Error("dummy weights: cannot make '" + e.name + "' of dtype " +
                  std::string(dtype_name(dtype)));
    }
    return t;
  }

 private:
  // The value of every element of a dummy fp32 scale tensor, by its role.
  float scale_value(const std::string& name) const {
    if (ends_with(name, "input_scale") || ends_with(name, "input_global_scale")) return 1.0f;
    if (quant_.method == quant::QuantConfig::Method::kNvfp4) {
      // std(w) = sqrt(E[e2m1²] · E[sf²]) · weight_scale_2 = kDummyStd.
      const float s2 = float(kDummyStd / std::sqrt(kE2m1MeanSquare * dummy_sf_mean_square()));
      return quant::nvfp4_scale_from_checkpoint(quant_, s2);  // stored as 1/s2 when reciprocal
    }
    return kDummyStd * 1.7320508f / 448.0f;  // FP8 weights uniform in ±448 have std 448/sqrt(3)
  }

  // The random stream of tensor `name`.
  uint64_t key_of(const std::string& name) const { return seed_ ^ std::hash<std::string>{}(name); }

  DType dtype_;
  uint64_t seed_;
};

}  // namespace

Tensor WeightSource::get_stored(const std::string& name) const {
  throw LoadError("dummy weights hold no stored tensor '" + name + "'");
}

backend::DummyDense WeightSource::dummy_dense(const std::string& name, const Shape&) const {
  throw LoadError("dummy_dense: '" + name + "' comes from a checkpoint, not dummy weights");
}

backend::DummyQuantized WeightSource::dummy_quantized(const std::string& name) const {
  throw LoadError("dummy_quantized: '" + name + "' comes from a checkpoint, not dummy weights");
}

void WeightSource::enable_nvfp4_activations() {
  using Method = quant::QuantConfig::Method;
  if (quant_.method != Method::kNvfp4 || !quant_.static_activations)
    throw InvalidArgument(
        "--nvfp4-activations needs an NVFP4 checkpoint with static input scales (input_scale / "
        "input_global_scale); this one is " +
        (quant_.method == Method::kNone ? std::string("not quantized")
                                        : std::string(quant::method_name(quant_.method))) +
        (quant_.method == Method::kNvfp4 ? " without input scales" : "") +
        (quant_.source.empty() ? "" : " (" + quant_.source + ")"));
  quant_.nvfp4_activations = true;
}

std::unique_ptr<WeightSource> open_checkpoint_weights(const std::string& model_dir) {
  return std::make_unique<CheckpointWeights>(model_dir);
}

std::unique_ptr<WeightSource> make_dummy_weights(DType dtype, uint64_t seed,
                                                 const quant::QuantConfig& quant) {
  return std::make_unique<DummyWeights>(dtype, seed, quant);
}

}  // namespace serval::model
