#include "quant/weight_names.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "base/error.h"
#include "base/math.h"

namespace serval::quant {
namespace {

using Method = QuantConfig::Method;

const std::vector<Shape> kScalarShapes = {Shape{}, Shape{1}};
const std::vector<DType> kScaleDtypes = {DType::kF32, DType::kBF16, DType::kF16};

std::string join_dtypes(const std::vector<DType>& ds) {
  std::string s;
  for (DType d : ds) s += (s.empty() ? "" : "|") + std::string(dtype_name(d));
  return s;
}

std::string join_shapes(const std::vector<Shape>& ss) {
  std::string s;
  for (const Shape& sh : ss) s += (s.empty() ? "" : " or ") + shape_str(sh);
  return s;
}

void check_scale(const char* what, float s) {
  if (!std::isfinite(s) || s < 0.0f)
    throw InvalidArgument(fmt::format("fuse: {} {} is not a finite number >= 0", what, s));
}

}  // namespace

bool matches(const ExpectedTensor& e, DType dtype, const Shape& shape) {
  return std::find(e.dtypes.begin(), e.dtypes.end(), dtype) != e.dtypes.end() &&
         std::find(e.shapes.begin(), e.shapes.end(), shape) != e.shapes.end();
}

void check_tensor(const ExpectedTensor& e, DType dtype, const Shape& shape) {
  if (matches(e, dtype, shape)) return;
  throw LoadError(fmt::format("tensor '{}' has {} {}, expected {} {}", e.name, dtype_name(dtype),
                              shape_str(shape), join_dtypes(e.dtypes), join_shapes(e.shapes)));
}

std::vector<ExpectedTensor> linear_tensors(const QuantConfig& c, std::string_view prefix, int64_t n,
                                           int64_t k, DType model_dtype) {
  std::string p(prefix);
  auto name = [&](const char* suffix) { return p + "." + suffix; };
  if (!is_quantized(c, prefix)) return {{name("weight"), {model_dtype}, {Shape{n, k}}}};

  std::vector<ExpectedTensor> out;
  switch (c.method) {
    case Method::kNone:
      break;  // is_quantized is false
    case Method::kNvfp4: {
      if (k % c.group_size != 0)
        throw InvalidArgument(
            fmt::format("{}: in_features {} is not a multiple of the NVFP4 "
                        "group size {}",
                        p, k, c.group_size));
      bool ct = c.reciprocal_global_scales;
      out.push_back({name(ct ? "weight_packed" : "weight"), {DType::kU8}, {Shape{n, k / 2}}});
      out.push_back({name("weight_scale"), {DType::kF8E4M3}, {Shape{n, k / c.group_size}}});
      out.push_back(
          {name(ct ? "weight_global_scale" : "weight_scale_2"), {DType::kF32}, kScalarShapes});
      if (c.static_activations)
        out.push_back(
            {name(ct ? "input_global_scale" : "input_scale"), {DType::kF32}, kScalarShapes});
      break;
    }
    case Method::kFp8PerTensor:
    case Method::kFp8PerChannel: {
      out.push_back({name("weight"), {DType::kF8E4M3}, {Shape{n, k}}});
      std::vector<Shape> scale_shapes = c.method == Method::kFp8PerTensor
                                            ? kScalarShapes
                                            : std::vector<Shape>{Shape{n, 1}, Shape{n}};
      out.push_back({name("weight_scale"), kScaleDtypes, scale_shapes});
      if (c.static_activations) out.push_back({name("input_scale"), kScaleDtypes, kScalarShapes});
      break;
    }
    case Method::kFp8Block: {
      out.push_back({name("weight"), {DType::kF8E4M3}, {Shape{n, k}}});
      Shape blocks{ceil_div<int64_t>(n, c.block_size[0]), ceil_div<int64_t>(k, c.block_size[1])};
      out.push_back({name(c.block_scale_name.c_str()), kScaleDtypes, {blocks}});
      break;
    }
  }
  return out;
}

float nvfp4_scale_from_checkpoint(const QuantConfig& c, float stored) {
  return c.reciprocal_global_scales ? 1.0f / stored : stored;
}

namespace {

// The fusion both per-tensor formats share: the fused scale and input scale are the shards' max;
// the bytes of the shard(s) holding the max are copied, the others' go through rescale(byte, s,
// max) (s < max). `scale_name` names the scale in errors.
template <typename Shard, typename Scale, typename Bytes, typename Rescale>
void fuse_rescaled(std::span<const Shard> shards, const char* scale_name, Scale scale_of,
                   Bytes bytes_of, Rescale rescale, float& fused_scale, float& fused_input,
                   std::vector<uint8_t>& fused_bytes) {
  size_t total = 0;
  for (const Shard& s : shards) {
    check_scale(scale_name, scale_of(s));
    check_scale("input_scale", s.input_scale);
    fused_scale = std::max(fused_scale, scale_of(s));
    fused_input = std::max(fused_input, s.input_scale);
    total += bytes_of(s).size();
  }
  fused_bytes.reserve(total);
  for (const Shard& s : shards) {
    const std::span<const uint8_t> bytes = bytes_of(s);
    if (scale_of(s) == fused_scale) {  // also covers the all-zero case (no division)
      fused_bytes.insert(fused_bytes.end(), bytes.begin(), bytes.end());
      continue;
    }
    for (uint8_t x : bytes) fused_bytes.push_back(rescale(x, scale_of(s), fused_scale));
  }
}

}  // namespace

Nvfp4Fused fuse_nvfp4_shards(std::span<const Nvfp4Shard> shards) {
  if (shards.empty()) throw InvalidArgument("fuse_nvfp4_shards: no shards");
  Nvfp4Fused f;
  fuse_rescaled(
      shards, "weight_scale_2", [](const Nvfp4Shard& s) { return s.weight_scale_2; },
      [](const Nvfp4Shard& s) { return s.block_scales; },
      [](uint8_t sf, float s, float max) {
        const float ratio = s / max;  // in [0, 1)
        return float_to_e4m3(e4m3_to_float(sf) * ratio);
      },
      f.weight_scale_2, f.input_scale, f.block_scales);
  return f;
}

Fp8Fused fuse_fp8_per_tensor_shards(std::span<const Fp8Shard> shards) {
  if (shards.empty()) throw InvalidArgument("fuse_fp8_per_tensor_shards: no shards");
  Fp8Fused f;
  fuse_rescaled(
      shards, "weight_scale", [](const Fp8Shard& s) { return s.weight_scale; },
      [](const Fp8Shard& s) { return s.weight; },
      [](uint8_t w, float s, float max) { return float_to_e4m3(e4m3_to_float(w) * s / max); },
      f.weight_scale, f.input_scale, f.weight);
  return f;
}

void check_block_fusable(std::string_view module, std::span<const int64_t> shard_rows,
                         int block_rows) {
  for (size_t i = 0; i + 1 < shard_rows.size(); ++i) {
    if (shard_rows[i] % block_rows != 0)
      throw LoadError(
          fmt::format("{}: shard {} has {} rows, not a multiple of the FP8 block "
                      "height {}; its block scales cannot be stacked",
                      module, i, shard_rows[i], block_rows));
  }
}

}  // namespace serval::quant
