// Qwen3MoeForCausalLM: Qwen3 with sparse MoE MLPs (softmax → top-k, renormalized when
// norm_topk_prob) on layers picked by decoder_sparse_step and mlp_only_layers.
#include "model/archs/archs.h"
#include "model/decoder.h"

namespace serval::model {

std::function<std::optional<MoeNames>(int)> qwen_moe_names(const io::ModelConfig& c) {
  return [&c](int layer) -> std::optional<MoeNames> {
    if (!c.is_moe_layer(layer)) return std::nullopt;
    const std::string prefix = "model.layers." + std::to_string(layer) + ".mlp";
    return MoeNames{prefix + ".gate.weight", prefix + ".experts.{e}.{proj}.weight", "gate_proj",
                    "up_proj", "down_proj"};
  };
}

std::unique_ptr<Model> make_qwen3_moe(const io::ModelConfig& c, const WeightSource& w,
                                      backend::Backend& b, const LoadOptions& o) {
  DecoderSpec spec;
  spec.qk_norm = true;
  spec.moe_inter = c.moe_intermediate_size;
  spec.moe_names = qwen_moe_names(c);
  return std::make_unique<Decoder>(c, spec, w, b, o);
}

}  // namespace serval::model
