#include "model/quantized_weight.h"

#include <cstring>
#include <span>

#include <fmt/format.h>

#include "base/error.h"
#include "base/math.h"
#include "model/layers/layers.h"
#include "quant/weight_names.h"

namespace serval::model {

namespace {

using Method = quant::QuantConfig::Method;
using kernels::WeightFormat;

float scalar(const Tensor& t) {
  return load_as_float(t.data, t.dtype, 0);
}

std::span<const uint8_t> bytes(const Tensor& t) {
  return {static_cast<const uint8_t*>(t.data), t.nbytes()};
}

Tensor from_bytes(DType dtype, Shape shape, const std::vector<uint8_t>& src) {
  Tensor t = host_empty(dtype, std::move(shape));
  check(t.nbytes() == src.size(), "from_bytes: size");
  std::memcpy(t.data, src.data(), src.size());
  return t;
}

// A float tensor of any float dtype and shape as f32 with `shape`.
Tensor to_f32(const Tensor& t, Shape shape) {
  Tensor out = host_empty(DType::kF32, std::move(shape));
  check(out.numel() == t.numel(), "to_f32: element count");
  for (int64_t i = 0; i < t.numel(); ++i)
    out.as<float>()[i] = load_as_float(t.data, t.dtype, size_t(i));
  return out;
}

Tensor concat(const std::vector<Tensor>& parts) {
  return parts.size() == 1 ? parts[0] : concat_rows(parts);
}

// Storage bytes of one quantized [n, k] linear.
int64_t quantized_bytes(const quant::QuantConfig& q, int64_t n, int64_t k) {
  switch (q.method) {
    case Method::kNvfp4:
      return n * k / 2 + n * (k / 16) + 8;
    case Method::kFp8PerTensor:
      return n * k + 8;
    case Method::kFp8PerChannel:
      return n * k + 4 * n + 4;
    case Method::kFp8Block:
      return n * k +
             4 * ceil_div<int64_t>(n, q.block_size[0]) * ceil_div<int64_t>(k, q.block_size[1]);
    case Method::kNone:
      break;
  }
  return 0;
}

}  // namespace

kernels::WeightFormat weight_format(quant::QuantConfig::Method m) {
  switch (m) {
    case Method::kNvfp4:
      return WeightFormat::kNvfp4;
    case Method::kFp8PerTensor:
      return WeightFormat::kFp8PerTensor;
    case Method::kFp8PerChannel:
      return WeightFormat::kFp8PerChannel;
    case Method::kFp8Block:
      return WeightFormat::kFp8Block;
    case Method::kNone:
      break;
  }
  throw InvalidArgument("weight_format: an unquantized config has no weight format");
}

backend::Weight read_linear(const WeightSource& w, const std::vector<LinearShard>& shards,
                            int64_t k) {
  check(!shards.empty(), "read_linear: no shards");
  const quant::QuantConfig& c = w.quant_config();
  std::vector<std::string> names;
  for (const LinearShard& s : shards) names.push_back(s.module);
  if (!quant::shards_quantized(c, names)) {
    std::vector<Tensor> parts;
    for (const LinearShard& s : shards) parts.push_back(w.get(s.module + ".weight", {s.rows, k}));
    return {concat(parts), std::nullopt};
  }

  // tensors[i]: shard i's tensors in linear_tensors order (weight, scale(s), input scale).
  std::vector<std::vector<Tensor>> tensors;
  int64_t n = 0;
  for (const LinearShard& s : shards) {
    std::vector<Tensor> ts;
    for (const quant::ExpectedTensor& e :
         quant::linear_tensors(c, s.module, s.rows, k, DType::kBF16))
      ts.push_back(w.get_expected(e));
    tensors.push_back(std::move(ts));
    n += s.rows;
  }
  backend::QuantizedWeight q;
  q.format = weight_format(c.method);
  q.n = int(n);
  q.k = int(k);
  std::vector<Tensor> data;
  for (const auto& ts : tensors) data.push_back(ts[0]);
  // The static activation scale of shard i (1 when the checkpoint has none), as a multiplier.
  auto input_scale = [&](size_t i, size_t index) {
    if (!c.static_activations) return 1.0f;
    const float stored = scalar(tensors[i].at(index));
    return c.method == Method::kNvfp4 ? quant::nvfp4_scale_from_checkpoint(c, stored) : stored;
  };

  switch (c.method) {
    case Method::kNvfp4: {
      std::vector<quant::Nvfp4Shard> parts;
      for (size_t i = 0; i < shards.size(); ++i)
        parts.push_back({quant::nvfp4_scale_from_checkpoint(c, scalar(tensors[i][2])),
                         input_scale(i, 3), bytes(tensors[i][1])});
      quant::Nvfp4Fused f = quant::fuse_nvfp4_shards(parts);
      q.data = concat(data);
      q.scales = from_bytes(DType::kF8E4M3, {n, k / c.group_size}, f.block_scales);
      q.global_scale = {f.weight_scale_2};
      q.input_scale = {f.input_scale};
      q.quantize_activations = c.nvfp4_activations;
      break;
    }
    case Method::kFp8PerTensor: {
      std::vector<quant::Fp8Shard> parts;
      for (size_t i = 0; i < shards.size(); ++i)
        parts.push_back({scalar(tensors[i][1]), input_scale(i, 2), bytes(tensors[i][0])});
      quant::Fp8Fused f = quant::fuse_fp8_per_tensor_shards(parts);
      q.data = shards.size() == 1 ? data[0] : from_bytes(DType::kF8E4M3, {n, k}, f.weight);
      q.global_scale = {f.weight_scale};
      q.input_scale = {f.input_scale};
      break;
    }
    case Method::kFp8PerChannel: {
      std::vector<Tensor> scales;
      float in = 0.0f;
      for (size_t i = 0; i < shards.size(); ++i) {
        scales.push_back(to_f32(tensors[i][1], {shards[i].rows}));
        in = std::max(in, input_scale(i, 2));
      }
      q.data = concat(data);
      q.scales = concat(scales);
      q.global_scale = {1.0f};
      q.input_scale = {in};
      break;
    }
    case Method::kFp8Block: {
      std::vector<int64_t> rows;
      std::vector<Tensor> scales;
      for (size_t i = 0; i < shards.size(); ++i) {
        rows.push_back(shards[i].rows);
        scales.push_back(to_f32(tensors[i][1], tensors[i][1].shape));
      }
      quant::check_block_fusable(shards[0].module, rows, c.block_size[0]);
      q.data = concat(data);
      q.scales = concat(scales);
      q.global_scale = {1.0f};
      q.input_scale = {1.0f};
      q.block_n = c.block_size[0];
      q.block_k = c.block_size[1];
      break;
    }
    case Method::kNone:
      break;  // shards_quantized was false
  }
  return {Tensor{}, std::move(q)};
}

backend::Weight load_linear(const WeightSource& w, backend::Backend& b,
                            const std::vector<LinearShard>& shards, int64_t k) {
  backend::Weight host = read_linear(w, shards, k);
  if (host.q) return {Tensor{}, b.upload_quantized(*host.q)};
  return {b.upload_weight(host.dense), std::nullopt};
}

backend::QuantizedWeight stack_experts(const std::vector<backend::QuantizedWeight>& parts) {
  check(!parts.empty(), "stack_experts: no experts");
  const backend::QuantizedWeight& first = parts[0];
  backend::QuantizedWeight out = first;
  out.experts = int(parts.size());
  out.global_scale.clear();
  out.input_scale.clear();
  auto stacked = [&](const Tensor& t) {
    Shape shape = t.shape;
    shape.insert(shape.begin(), int64_t(parts.size()));
    return host_empty(t.dtype, shape);
  };
  out.data = stacked(first.data);
  if (first.scales.data) out.scales = stacked(first.scales);
  for (size_t e = 0; e < parts.size(); ++e) {
    const backend::QuantizedWeight& p = parts[e];
    if (p.format != first.format || p.n != first.n || p.k != first.k || p.experts != 0 ||
        p.data.nbytes() != first.data.nbytes() || p.scales.nbytes() != first.scales.nbytes())
      throw InvalidArgument(fmt::format("stack_experts: expert {} differs in format or shape", e));
    std::memcpy(static_cast<char*>(out.data.data) + e * p.data.nbytes(), p.data.data,
                p.data.nbytes());
    if (p.scales.data)
      std::memcpy(static_cast<char*>(out.scales.data) + e * p.scales.nbytes(), p.scales.data,
                  p.scales.nbytes());
    out.global_scale.push_back(p.global_scale.at(0));
    out.input_scale.push_back(p.input_scale.at(0));
  }
  return out;
}

namespace {

// One MLA layer's attention weights under `attn` ("model.layers.N.self_attn."): kv_b_proj is
// always dense (MlaAttention refuses it quantized).
template <typename Linear, typename Dense>
int64_t mla_attention_bytes(const io::ModelConfig& c, const std::string& attn, Linear linear,
                            Dense dense) {
  const io::MlaConfig& m = c.mla;
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  int64_t total = 0;
  if (m.q_lora_rank > 0) {
    total += linear(attn + "q_a_proj", m.q_lora_rank, h) + dense(m.q_lora_rank) +
             linear(attn + "q_b_proj", heads * qk, m.q_lora_rank);
  } else {
    total += linear(attn + "q_proj", heads * qk, h);
  }
  total += linear(attn + "kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, h) +
           dense(m.kv_lora_rank) +
           dense(heads * (m.qk_nope_head_dim + m.v_head_dim) * int64_t(m.kv_lora_rank)) +
           linear(attn + "o_proj", h, heads * m.v_head_dim);
  return total;
}

}  // namespace

int64_t model_weight_bytes(const io::ModelConfig& c, const quant::QuantConfig& q, DType dtype) {
  const int64_t bits = dtype_bits(dtype);
  auto dense = [&](int64_t elements) { return elements * bits / 8; };
  auto linear = [&](const std::string& module, int64_t n, int64_t k) {
    return quant::is_quantized(q, module) ? quantized_bytes(q, n, k) : dense(n * k);
  };
  const int64_t h = c.hidden_size, q_dim = int64_t(c.num_attention_heads) * c.head_dim,
                kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
  const bool mixtral = c.architecture == "MixtralForCausalLM";
  const int64_t moe_inter =
      c.moe_intermediate_size > 0 ? c.moe_intermediate_size : c.intermediate_size;
  int64_t total = dense(int64_t(c.vocab_size) * h + h);                   // embeddings, final norm
  if (!c.tie_word_embeddings) total += dense(int64_t(c.vocab_size) * h);  // lm_head: dense
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    if (c.is_mla()) {
      total += mla_attention_bytes(c, p + "self_attn.", linear, dense);
    } else {
      total += c.fused_projections ? linear(p + "self_attn.qkv_proj", q_dim + 2 * kv_dim, h)
                                   : linear(p + "self_attn.q_proj", q_dim, h) +
                                         linear(p + "self_attn.k_proj", kv_dim, h) +
                                         linear(p + "self_attn.v_proj", kv_dim, h);
      total += linear(p + "self_attn.o_proj", h, q_dim);
    }
    if (c.attention_bias) total += dense(q_dim + 2 * kv_dim + h);
    if (c.qkv_bias && !c.attention_bias) total += dense(q_dim + 2 * kv_dim);
    if (c.qk_norm) total += dense(2 * int64_t(c.head_dim));
    total += dense(2 * h);  // input and post-attention norms
    if (c.is_moe_layer(i)) {
      const std::string e = p + (mixtral ? "block_sparse_moe.experts.0." : "mlp.experts.0.");
      const int64_t E = c.num_experts;
      total += dense(E * h);  // router
      total += E * (linear(e + (mixtral ? "w1" : "gate_proj"), moe_inter, h) +
                    linear(e + (mixtral ? "w3" : "up_proj"), moe_inter, h) +
                    linear(e + (mixtral ? "w2" : "down_proj"), h, moe_inter));
      if (const int64_t S = c.shared_expert_intermediate_size; S > 0) {
        // Qwen2-MoE's one gated shared expert, or DeepSeek's ungated ones (one MLP of width S).
        const std::string s =
            p + (c.n_shared_experts > 0 ? "mlp.shared_experts." : "mlp.shared_expert.");
        total += linear(s + "gate_proj", S, h) + linear(s + "up_proj", S, h) +
                 linear(s + "down_proj", h, S) + (c.n_shared_experts > 0 ? 0 : dense(h));
      }
    } else {
      const int64_t I = c.intermediate_size;
      total += c.fused_projections
                   ? linear(p + "mlp.gate_up_proj", 2 * I, h)
                   : linear(p + "mlp.gate_proj", I, h) + linear(p + "mlp.up_proj", I, h);
      total += linear(p + "mlp.down_proj", h, I);
      if (c.mlp_bias) total += dense(2 * I + h);
    }
  }
  return total;
}

}  // namespace serval::model
