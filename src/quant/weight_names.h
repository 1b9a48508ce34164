// The tensors a checkpoint holds for one linear module under a QuantConfig (names, dtypes,
// shapes), and the scale arithmetic that fuses q/k/v or gate/up shards into one module.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "quant/quant_config.h"
#include "tensor/tensor.h"

namespace serval::quant {

// One tensor the checkpoint must hold. Several shapes / dtypes are accepted where producers
// differ: scalars are stored as [] or [1], per-channel scales as [N, 1] or [N], scales as f32
// or the model dtype. The first entry of each list is the canonical one.
struct ExpectedTensor {
  std::string name;
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
};

// LoadError "tensor '<name>' has <dtype> <shape>, expected <dtypes> <shapes> (<what>)" unless
// (dtype, shape) is one of the accepted combinations.
void check_tensor(const ExpectedTensor& e, DType dtype, const Shape& shape);
bool matches(const ExpectedTensor& e, DType dtype, const Shape& shape);

// Tensors of the linear module `prefix` ("model.layers.0.self_attn.q_proj") computing
// y[., N] = x[., K] · W^T. Unquantized modules (is_quantized false): prefix.weight [N, K] in
// `model_dtype`. Bias tensors are the architecture's business and are not listed.
//   NVFP4 ModelOpt:  weight u8 [N, K/2], weight_scale e4m3 [N, K/16], weight_scale_2 f32 [],
//                    input_scale f32 [] (when static_activations).
//   NVFP4 compressed-tensors: weight_packed, weight_scale, weight_global_scale,
//                    input_global_scale (reciprocals of scale_2 / input_scale).
//   FP8 per-tensor:  weight e4m3 [N, K], weight_scale f32 [], input_scale f32 [] (static).
//   FP8 per-channel: weight e4m3 [N, K], weight_scale [N, 1] | [N], input_scale (static).
//   FP8 block:       weight e4m3 [N, K], <block_scale_name> f32 [ceil(N/bn), ceil(K/bk)].
// InvalidArgument when K is not a multiple of the NVFP4 group size.
std::vector<ExpectedTensor> linear_tensors(const QuantConfig& c, std::string_view prefix,
                                           int64_t out_features, int64_t in_features,
                                           DType model_dtype);

// A global scale as the checkpoint stores it -> the multiplier SPEC 2.1 uses
// (w = e2m1 · weight_scale · weight_scale_2): 1/stored for compressed-tensors NVFP4.
float nvfp4_scale_from_checkpoint(const QuantConfig& c, float stored);

// One NVFP4 shard of a fused module. Scales are true multipliers (after
// nvfp4_scale_from_checkpoint). block_scales: e4m3 bytes [N_i, K/16] row-major.
struct Nvfp4Shard {
  float weight_scale_2 = 1.0f;
  float input_scale = 1.0f;
  std::span<const uint8_t> block_scales;
};
struct Nvfp4Fused {
  float weight_scale_2 = 0.0f;        // max over shards
  float input_scale = 0.0f;           // max over shards
  std::vector<uint8_t> block_scales;  // shards' rescaled scales stacked along N
};
// SPEC 2.1: the fused global scale is the max m of the shards' weight_scale_2; each block scale
// of shard i becomes float_to_e4m3(e4m3_to_float(sf) * (s_i / m)) (RNE, saturating), so
// e2m1 · sf' · m ≈ e2m1 · sf · s_i. Bytes of the shard holding the max are copied unchanged.
// InvalidArgument for no shards or a scale that is not a finite number >= 0.
Nvfp4Fused fuse_nvfp4_shards(std::span<const Nvfp4Shard> shards);

// One FP8 per-tensor shard: e4m3 weight bytes [N_i, K] and its scalar scales.
struct Fp8Shard {
  float weight_scale = 1.0f;
  float input_scale = 1.0f;
  std::span<const uint8_t> weight;
};
struct Fp8Fused {
  float weight_scale = 0.0f;    // max over shards
  float input_scale = 0.0f;     // max over shards
  std::vector<uint8_t> weight;  // shards' requantized weights stacked along N
};
// w8' = float_to_e4m3(e4m3_to_float(w8) * s_i / s_max) (left to right in float; shards with
// s_i == s_max are copied unchanged). Per-channel and block FP8 need no requantization: their
// scales stack along N (see check_block_fusable).
Fp8Fused fuse_fp8_per_tensor_shards(std::span<const Fp8Shard> shards);

// Block-scale FP8 shards stack along N only if each shard's rows fill whole blocks (except the
// last shard); LoadError naming `module` otherwise.
void check_block_fusable(std::string_view module, std::span<const int64_t> shard_rows,
                         int block_rows);

}  // namespace serval::quant
