// MixtralForCausalLM: Llama attention with an MoE MLP on every layer (block_sparse_moe,
// experts w1 = gate, w3 = up, w2 = down; softmax → top-k → renormalize).
#include "model/archs/archs.h"
#include "model/decoder.h"

namespace serval::model {

std::unique_ptr<Model> make_mixtral(const io::ModelConfig& c, const WeightSource& w,
                                    backend::Backend& b, const LoadOptions& o) {
  io::ModelConfig config = c;
  config.norm_topk_prob = true;
  DecoderSpec spec;
  spec.moe_inter = c.moe_intermediate_size > 0 ? c.moe_intermediate_size : c.intermediate_size;
  spec.moe_names = [](int layer) -> std::optional<MoeNames> {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".block_sparse_moe";
    return MoeNames{prefix + ".gate.weight", prefix + ".experts.{e}.{proj}.weight", "w1", "w3",
                    "w2"};
  };
  return std::make_unique<Decoder>(config, spec, w, b, o);
}

}  // namespace serval::model
