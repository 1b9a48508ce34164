// Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) with, on
// the layers decoder_sparse_step and mlp_only_layers pick, softmax → top-k routed experts (not
// renormalized unless norm_topk_prob) plus a shared expert gated by a sigmoid.
#include "model/archs/archs.h"
#include "model/decoder.h"

namespace serval::model {

std::unique_ptr<Model> make_qwen2_moe(const io::ModelConfig& c, const WeightSource& w,
                                      backend::Backend& b, const LoadOptions& o) {
  DecoderSpec spec;
  spec.moe_inter = c.moe_intermediate_size;
  spec.shared_expert = "shared_expert";
  spec.shared_expert_gated = true;
  spec.moe_names = qwen_moe_names(c);
  return std::make_unique<Decoder>(c, spec, w, b, o);
}

}  // namespace serval::model
