#include "model/decoder.h"

#include "base/error.h"

namespace serval::model {

Decoder::Decoder(const io::ModelConfig& c, const DecoderSpec& spec, const WeightSource& w,
                 backend::Backend& b, const LoadOptions& options)
    : c_(c), b_(b) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  embed_ = b.upload_weight(w.get("model.embed_tokens.weight", {V, H}));
  final_norm_ = b.upload_weight(w.get("model.norm.weight", {H}));
  lm_head_ = c.tie_word_embeddings ? embed_ : b.upload_weight(w.get("lm_head.weight", {V, H}));
  inv_freq_ = b.upload(rope_inv_freq(c));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i);
    Layer layer;
    layer.input_norm = b.upload_weight(w.get(prefix + ".input_layernorm.weight", {H}));
    layer.post_attention_norm =
        b.upload_weight(w.get(prefix + ".post_attention_layernorm.weight", {H}));
    layer.attn = std::make_unique<Attention>(c, w, b, prefix + ".self_attn", spec.qk_norm);
    std::optional<MoeNames> moe = spec.moe_names ? spec.moe_names(i) : std::nullopt;
    if (moe) {
      layer.moe = std::make_unique<MoeBlock>(c, spec.moe_inter, w, b, *moe, options.moe_backend);
      moe_backend_ = options.moe_backend;
    } else {
      layer.mlp =
          std::make_unique<Mlp>(c, c.intermediate_size, w, b, prefix + ".mlp.gate_proj.weight",
                                prefix + ".mlp.up_proj.weight", prefix + ".mlp.down_proj.weight");
    }
    layers_.push_back(std::move(layer));
  }
}

KvGeometry Decoder::kv_geometry() const {
  return {c_.num_hidden_layers, c_.num_key_value_heads, c_.head_dim};
}

Tensor Decoder::forward(const backend::StepMetadata& meta,
                        std::vector<backend::KvCacheLayer>& kv_cache) {
  const int64_t T = meta.num_tokens, H = c_.hidden_size;
  const DType act = b_.activation_dtype();
  // residual: the running sum of the stream; delta: the last block's output, added to the
  // residual by the next fused add + RMSNorm.
  Tensor residual = b_.empty(act, {T, H});
  Tensor delta = b_.empty(act, {T, H});
  Tensor x = b_.empty(act, {T, H});
  b_.embedding(embed_, meta.token_ids, residual);
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    // Everything a layer allocates is dead once it has written `delta` and `residual`.
    const int64_t mark = b_.step_mark();
    if (i == 0) {
      b_.rms_norm(residual, nullptr, layer.input_norm, c_.rms_norm_eps, x);
    } else {
      b_.rms_norm(delta, &residual, layer.input_norm, c_.rms_norm_eps, x);
    }
    layer.attn->forward(x, meta, inv_freq_, kv_cache[i], delta);
    b_.rms_norm(delta, &residual, layer.post_attention_norm, c_.rms_norm_eps, x);
    if (layer.moe) {
      layer.moe->forward(x, delta);
    } else {
      layer.mlp->forward(x, delta);
    }
    b_.step_release(mark);
  }
  b_.rms_norm(delta, &residual, final_norm_, c_.rms_norm_eps, x);
  Tensor last = b_.empty(act, {meta.num_logits, H});
  b_.gather_rows(x, meta.logits_indices, last);
  Tensor logits = b_.empty(DType::kF32, {meta.num_logits, c_.vocab_size});
  b_.linear(last, lm_head_, nullptr, logits);
  return logits;
}

}  // namespace serval::model
