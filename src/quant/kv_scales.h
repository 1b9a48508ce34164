// FP8 KV-cache scales (SPEC 3): finds the per-layer k/v scale tensors of a checkpoint under
// every accepted naming and maps them to attention layers.
#pragma once
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/tensor.h"

namespace serval::quant {

// Per attention layer: store k8 = fp8(k / k[i]), read k = k8 · k[i] (same for v).
struct KvScales {
  std::vector<float> k, v;            // [num_layers]; 1.0 for layers without scales
  int num_loaded_layers = 0;          // attention layers with a k or v scale from the checkpoint
  int num_default_layers = 0;         // attention layers with neither (they use 1.0)
  std::vector<std::string> warnings;  // at most one line per kind; the caller logs them
  std::vector<std::string> consumed;  // the checkpoint tensors read as KV scales
};

struct KvScaleOptions {
  int num_layers = 0;
  // Checkpoint prefix of decoder layer i; "{i}" stands for the decimal index.
  std::string layer_pattern = "model.layers.{i}";
  // Which layers have attention (hybrid models); empty means all. A scale on another layer
  // is an error, and only attention layers count as defaulted.
  std::vector<bool> attention_layers;
};

// True if `name` looks like a KV-cache scale: its last component is k_scale, v_scale or
// kv_scale, or it ends with k_proj.output_scale / v_proj.output_scale. Weight and activation
// scales (weight_scale, weight_scale_2, weight_scale_inv, input_scale, q_proj.output_scale,
// o_proj.output_scale, q_scale, prob_scale) are not.
bool is_kv_scale_name(std::string_view name);

// The checkpoint tensor `name` as stored (any float dtype, any shape).
using TensorReader = std::function<Tensor(const std::string& name)>;

// Relative to the layer prefix, the accepted names are
//   self_attn.k_proj.k_scale, self_attn.v_proj.v_scale         (ModelOpt)
//   self_attn.qkv_proj.{k,v}_scale, self_attn.{k,v}_scale, self_attn.attn.{k,v}_scale
//   mixer.k_proj.k_scale, mixer.v_proj.v_scale                 (hybrid models)
//   {self_attn,mixer}.{k,v}_proj.output_scale                  (compressed-tensors)
//   self_attn.kv_scale, self_attn.attn.kv_scale                (legacy; used for k and v)
// Rules: every name for which is_kv_scale_name holds must map to an attention layer in
// [0, num_layers), else LoadError naming the tensor; a scale must hold exactly one element
// (LoadError naming it and its shape) that is finite and > 0; two tensors giving different
// values for one layer's k (or v) is a LoadError naming both. A layer with only k or only v
// uses that value for both (one warning line counts such layers); a layer with neither uses
// 1.0 (one warning line counts them). Only names passing is_kv_scale_name are read.
KvScales load_kv_scales(std::span<const std::string> names, const KvScaleOptions& options,
                        const TensorReader& read);

}  // namespace serval::quant
