// Loading linear weights, dense or quantized (NVFP4, FP8), from a WeightSource: reading the
// tensors the quantization config names, fusing q/k/v and gate/up shards, stacking MoE experts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/weight_source.h"
#include "quant/quant_config.h"

namespace serval::model {

// One checkpoint module fused into a linear: its name without ".weight"
// ("model.layers.0.self_attn.q_proj") and its output rows.
struct LinearShard {
  std::string module;
  int64_t rows = 0;
};

// The weight format of a quantization method (InvalidArgument for Method::kNone).
kernels::WeightFormat weight_format(quant::QuantConfig::Method m);

// The host weight of the modules `shards` stacked along the output rows, with in_features
// `k`: dense (the shards' ".weight" tensors concatenated, stored dtype) when the quantization
// config leaves them unquantized, else quantized (experts == 0) with the shards fused per
// SPEC §2.1: NVFP4 and FP8 per-tensor take the max global / input scale and rescale the other
// shards (quant::fuse_nvfp4_shards / fuse_fp8_per_tensor_shards); per-channel and block
// scales stack along the rows. Scales are converted to f32 (NVFP4 block scales stay E4M3) and
// compressed-tensors reciprocals to multipliers. LoadError names the tensor for a missing
// tensor or a wrong dtype / shape, and the module when shards mix quantized and dense.
backend::Weight read_linear(const WeightSource& w, const std::vector<LinearShard>& shards,
                            int64_t k);

// read_linear, then onto the backend's device (upload_weight / upload_quantized).
backend::Weight load_linear(const WeightSource& w, backend::Backend& b,
                            const std::vector<LinearShard>& shards, int64_t k);

// Stacks per-expert quantized weights of one format and shape into one weight with
// experts = parts.size(); each expert keeps its own global and input scales.
backend::QuantizedWeight stack_experts(const std::vector<backend::QuantizedWeight>& parts);

// Bytes the model's weights take when loaded: quantized linears at their storage size (NVFP4
// 0.5 B per weight + one E4M3 byte per 16; FP8 1 B + its scales), everything else in `dtype`.
int64_t model_weight_bytes(const io::ModelConfig& c, const quant::QuantConfig& q, DType dtype);

}  // namespace serval::model
