#include "model/decoder.h"

#include <utility>

#include "base/error.h"
#include "model/layers/dummy_load.h"
#include "model/layers/mla.h"
#include "model/layers/shard.h"

namespace serval::model {

namespace {

void validate_shard(const ShardSpec& s) {
  dist::validate(s.parallel);
  const int world = s.parallel.world_size();
  const std::string ranks = std::to_string(world) + " ranks";
  if (s.dp_attention) {
    // Data-parallel replicas share a model only when their experts are split over all ranks.
    if (!s.dp_moe())
      throw InvalidArgument(
          "model loading: data-parallel replicas share a model only with "
          "expert parallel (dp " +
          std::to_string(s.parallel.dp_size) + ")");
    if (!s.dp_comm || s.dp_comm->size() != world ||
        s.dp_comm->rank() != dist::global_rank(s.parallel, s.coord))
      throw InvalidArgument("model loading: " + ranks +
                            " need an all-rank communicator whose rank is this one's");
    if (s.parallel.tp_size > 1 &&
        (!s.comm || s.comm->size() != s.parallel.tp_size || s.comm->rank() != s.coord.tp_rank))
      throw InvalidArgument("model loading: tensor parallel " + std::to_string(s.parallel.tp_size) +
                            " needs the replica's communicator of that size");
    return;
  }
  if (s.parallel.tp_size > 1 && s.parallel.dp_size > 1)
    throw InvalidArgument(
        "model loading: tensor parallel with data parallel needs per-replica communicators "
        "(dp_attention), not set (tp " +
        std::to_string(s.parallel.tp_size) + ", dp " + std::to_string(s.parallel.dp_size) + ")");
  if (world > 1 && (!s.comm || s.comm->size() != world ||
                    s.comm->rank() != dist::global_rank(s.parallel, s.coord)))
    throw InvalidArgument("model loading: " + ranks +
                          " need a communicator of that size whose rank is this one's");
}

}  // namespace

Decoder::Decoder(const io::ModelConfig& c, const DecoderSpec& spec, const WeightSource& w,
                 backend::Backend& b, const LoadOptions& options)
    : c_(c), b_(b), pooling_(options.pooling), shard_(options.shard) {
  validate_shard(shard_);
  // What the layers do not compute is refused, not ignored: the outputs would be wrong.
  if (c.mlp_bias)
    throw LoadError("config.json: mlp_bias true (biases on the MLP projections) is not supported");
  if (c.hidden_act != "silu" && c.hidden_act != "swish")
    throw LoadError("config.json: hidden_act '" + c.hidden_act +
                    "' is not supported (serval's MLPs are SwiGLU: silu)");
  const dist::TpLayout tp = shard_.tp();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  if (spec.mla) {  // one latent row per token, no values
    kv_ = {c.num_hidden_layers, 1, c.mla.kv_lora_rank + c.mla.qk_rope_head_dim, false};
  } else {
    const int heads =
        int(dist::shard_attention(tp, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
                .kv_heads.size());
    kv_ = {c.num_hidden_layers, heads, c.head_dim};
  }
  const std::string embed_name = "model.embed_tokens.weight";
  const std::string head_name = c.tie_word_embeddings ? embed_name : "lm_head.weight";
  embed_ = load_dense(w, b, embed_name, {V, H});
  final_norm_ = load_dense(w, b, "model.norm.weight", {H});
  vocab_ = tp.size > 1 ? dist::shard_vocab(tp, V).real : dist::Range{0, V};
  if (tp.size == 1) {
    lm_head_ = c.tie_word_embeddings ? embed_ : load_dense(w, b, head_name, {V, H});
  } else if (vocab_.size() > 0) {
    lm_head_ = load_dense_rows(w, b, {{head_name, {V, H}, vocab_}});  // tied: the same rows
  }
  inv_freq_ = b.upload(rope_inv_freq(c));
  std::optional<dist::MoeShard> moe_shard;
  if (spec.moe_inter > 0 && c.num_experts > 0)
    moe_shard = dist::shard_moe(shard_.parallel, shard_.coord, c.num_experts, spec.moe_inter);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i);
    Layer layer;
    layer.input_norm = load_dense(w, b, prefix + ".input_layernorm.weight", {H});
    layer.post_attention_norm = load_dense(w, b, prefix + ".post_attention_layernorm.weight", {H});
    if (spec.mla) {
      layer.attn = std::make_unique<MlaAttention>(c, w, b, prefix + ".self_attn", tp);
    } else {
      layer.attn = std::make_unique<Attention>(c, w, b, prefix + ".self_attn", spec.qk_norm, tp);
    }
    std::optional<MoeNames> moe = spec.moe_names ? spec.moe_names(i) : std::nullopt;
    if (moe) {
      layer.moe =
          std::make_unique<MoeBlock>(c, spec.moe_inter, w, b, *moe, options.moe_backend, moe_shard);
      moe_backend_ = options.moe_backend;
      if (!spec.shared_expert.empty()) {
        if (c.shared_expert_intermediate_size <= 0)
          throw LoadError("config.json: " + c.architecture +
                          " needs shared_expert_intermediate_size > 0");
        // The shared expert is split like a dense MLP over the tensor-parallel group (whole on
        // each rank without one); forward() says how its output joins the experts'.
        const std::string mlp = prefix + ".mlp." + spec.shared_expert;
        layer.shared_expert = std::make_unique<Mlp>(
            c, c.shared_expert_intermediate_size, w, b, mlp + ".gate_proj.weight",
            mlp + ".up_proj.weight", mlp + ".down_proj.weight", tp);
        if (spec.shared_expert_gated)
          layer.shared_expert_gate =
              load_dense(w, b, prefix + ".mlp.shared_expert_gate.weight", {1, H});
      }
    } else {
      const std::string mlp = prefix + ".mlp.";
      const std::string gate = mlp + (c.fused_projections ? "gate_up_proj" : "gate_proj");
      const std::string up = mlp + (c.fused_projections ? "gate_up_proj" : "up_proj");
      layer.mlp = std::make_unique<Mlp>(c, c.intermediate_size, w, b, gate + ".weight",
                                        up + ".weight", mlp + "down_proj.weight", tp);
    }
    layers_.push_back(std::move(layer));
  }
}

void Decoder::add_shared_expert(Layer& layer, const Tensor& x, Tensor& out, bool reduce) {
  const DType act = b_.activation_dtype();
  Tensor shared = b_.empty(act, {x.dim(0), c_.hidden_size});
  layer.shared_expert->forward(x, shared);
  if (reduce) shard_.comm->all_reduce_sum(shared);
  if (!layer.shared_expert_gate.data) {
    b_.add(shared, out);
    return;
  }
  Tensor gate = b_.empty(act, {x.dim(0), 1});
  b_.linear(x, layer.shared_expert_gate, nullptr, gate);
  b_.sigmoid_gate_add(gate, shared, out);
}

KvGeometry Decoder::kv_geometry() const {
  return kv_;
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
  // True while `delta` holds this rank's partial sum of a row-parallel layer (tensor or expert
  // parallel): the next add + norm all-reduces it first, fused where the communicator can.
  bool delta_partial = false;
  // residual += delta (all-reduced first when partial), out = RMSNorm(residual) · weight.
  auto add_norm_into = [&](const Tensor& weight, Tensor& out) {
    if (delta_partial &&
        shard_.comm->all_reduce_add_rms_norm(delta, residual, weight, c_.rms_norm_eps, out)) {
      delta_partial = false;
      return;
    }
    if (delta_partial) shard_.comm->all_reduce_sum(delta);
    delta_partial = false;
    b_.rms_norm(delta, &residual, weight, c_.rms_norm_eps, out);
  };
  auto add_norm = [&](const Tensor& weight) { add_norm_into(weight, x); };
  const bool tp = shard_.parallel.tp_size > 1;
  // Data parallel + expert parallel: every MoE layer runs on all replicas' rows; this replica's
  // are rows [dp_row_offset, + T) (their indices, for gathering them back, uploaded once).
  Tensor dp_rows;
  if (shard_.dp_moe()) {
    Tensor host = host_empty(DType::kI32, {T});
    for (int64_t i = 0; i < T; ++i) host.as<int32_t>()[i] = int32_t(meta.dp_row_offset + i);
    dp_rows = b_.upload(host);
  }
  // True when the last block already ran the add + norm in front of the next one (fused into
  // its own last kernel): residual holds the sum and x the next block's input; delta is spent.
  bool x_ready = false;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    // Everything a layer allocates is dead once it has written `delta` and `residual`.
    const int64_t mark = b_.step_mark();
    if (i == 0) {
      b_.rms_norm(residual, nullptr, layer.input_norm, c_.rms_norm_eps, x);
    } else if (!x_ready) {
      add_norm(layer.input_norm);
    }
    x_ready = false;
    layer.attn->forward(x, meta, inv_freq_, kv_cache[i], delta);
    delta_partial = tp;  // row-parallel o_proj
    if (layer.moe && shard_.dp_moe()) {
      // All replicas' normalized rows into one [rows_total, H] buffer (tensor-parallel rank 0
      // of each replica writes its rows, everyone else zeros: the all-reduce is a gather), the
      // local experts on every row, the partial outputs summed over all ranks, ours kept.
      Tensor all = b_.empty(act, {meta.dp_rows_total, H});
      b_.zero(all);
      Tensor mine = all.rows(meta.dp_row_offset, meta.dp_row_offset + T);
      add_norm_into(layer.post_attention_norm, shard_.coord.tp_rank == 0 ? mine : x);
      shard_.dp_comm->all_reduce_sum(all);
      Tensor out = b_.empty(act, {meta.dp_rows_total, H});
      layer.moe->forward(all, out);
      shard_.dp_comm->all_reduce_sum(out);
      b_.gather_rows(out, dp_rows, delta);
      // The shared expert on this replica's rows (in `mine` on every rank after the gather),
      // summed over the replica's tensor-parallel group when it is split.
      if (layer.shared_expert)
        add_shared_expert(layer, mine, delta, /*reduce=*/shard_.parallel.tp_size > 1);
    } else if (layer.moe) {
      // Post-attention norm and MoE block in one backend op (the CUDA backend fuses the norm,
      // the router and the routing for a few tokens), so the o_proj sum is all-reduced alone.
      // With a complete output, the add + norm in front of the next block (or the final norm)
      // may go into the block's last kernel.
      if (delta_partial) shard_.comm->all_reduce_sum(delta);
      delta_partial = shard_.moe_all_reduce();
      const Tensor* next_norm = nullptr;
      if (!delta_partial && !layer.shared_expert)
        next_norm = i + 1 < layers_.size() ? &layers_[i + 1].input_norm : &final_norm_;
      x_ready = layer.moe->forward_add_norm(delta, residual, layer.post_attention_norm,
                                            c_.rms_norm_eps, x, delta, next_norm);
      // x: the experts' input. The shared expert's output joins the experts' partial sums
      // (split over the tensor-parallel group, or, when expert parallel widens over dp_size
      // ranks that all run the same rows, whole on each: then only the first adds it).
      if (layer.shared_expert && shard_.coord.dp_rank == 0) add_shared_expert(layer, x, delta);
    } else {
      add_norm(layer.post_attention_norm);
      layer.mlp->forward(x, delta);
      delta_partial = tp;  // row-parallel down_proj
    }
    b_.step_release(mark);
  }
  if (!x_ready) add_norm(final_norm_);
  Tensor last = b_.empty(act, {meta.num_logits, H});
  b_.gather_rows(x, meta.logits_indices, last);
  if (pooling_) {  // embeddings: the rows' final hidden states (whole on every rank)
    Tensor hidden = b_.empty(DType::kF32, {meta.num_logits, H});
    b_.to_float(last, hidden);
    return hidden;
  }
  Tensor logits = b_.empty(DType::kF32, {meta.num_logits, c_.vocab_size});
  if (shard_.parallel.tp_size == 1) {
    b_.linear(last, lm_head_, nullptr, logits);
    return logits;
  }
  // Vocab-parallel LM head: this rank's rows of the vocabulary, then every rank's columns.
  Tensor local = b_.empty(DType::kF32, {meta.num_logits, vocab_.size()});
  if (vocab_.size() > 0 && meta.num_logits > 0) b_.linear(last, lm_head_, nullptr, local);
  shard_.comm->all_gather_columns(local, vocab_.begin, logits);
  return logits;
}

}  // namespace serval::model
