// DeepseekV2ForCausalLM / DeepseekV3ForCausalLM: multi-head latent attention (MlaAttention) on
// every layer; after first_k_dense_replace dense layers, MoE layers of routed experts (softmax
// top-k for V2, sigmoid scores with a selection bias and grouped top-k for V3, scaled by
// routed_scaling_factor) plus n_shared_experts ungated shared experts ("mlp.shared_experts").
#include "model/archs/archs.h"
#include "model/decoder.h"

namespace serval::model {

std::unique_ptr<Model> make_deepseek(const io::ModelConfig& c, const WeightSource& w,
                                     backend::Backend& b, const LoadOptions& o) {
  DecoderSpec spec;
  spec.mla = true;
  spec.moe_inter = c.moe_intermediate_size;
  if (c.n_shared_experts > 0) spec.shared_expert = "shared_experts";
  spec.moe_names = [&c](int layer) -> std::optional<MoeNames> {
    if (!c.is_moe_layer(layer)) return std::nullopt;
    const std::string mlp = "model.layers." + std::to_string(layer) + ".mlp";
    MoeNames names{mlp + ".gate.weight", mlp + ".experts.{e}.{proj}.weight", "gate_proj", "up_proj",
                   "down_proj"};
    if (c.moe_sigmoid_grouped) names.correction_bias = mlp + ".gate.e_score_correction_bias";
    return names;
  };
  return std::make_unique<Decoder>(c, spec, w, b, o);
}

}  // namespace serval::model
