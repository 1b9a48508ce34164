// Maps config.json architectures[0] to its factory: one line per architecture.
#include <string_view>

#include "base/error.h"
#include "model/archs/archs.h"

namespace serval::model {

namespace {

struct ArchEntry {
  std::string_view name;
  ArchFactory make;
};

constexpr ArchEntry kArchs[] = {
    {"LlamaForCausalLM", make_llama},
    {"MistralForCausalLM", make_llama},
    // Llama's layers with fused qkv / gate_up (ModelConfig::fused_projections)
    {"Phi3ForCausalLM", make_llama},
    {"Qwen2ForCausalLM", make_llama},  // Llama's layers, q/k/v biases (ModelConfig::qkv_bias)
    {"Qwen2MoeForCausalLM", make_qwen2_moe},
    {"Qwen3ForCausalLM", make_qwen3},
    {"Qwen3MoeForCausalLM", make_qwen3_moe},
    {"MixtralForCausalLM", make_mixtral},
    {"DeepseekV2ForCausalLM", make_deepseek},  // multi-head latent attention, shared experts
    {"DeepseekV3ForCausalLM", make_deepseek},  // and sigmoid grouped routing
};

}  // namespace

std::vector<std::string> known_architectures() {
  std::vector<std::string> names;
  for (const ArchEntry& e : kArchs) names.emplace_back(e.name);
  return names;
}

std::unique_ptr<Model> create_model(const io::ModelConfig& config, const WeightSource& weights,
                                    backend::Backend& backend, const LoadOptions& options) {
  for (const ArchEntry& e : kArchs) {
    if (e.name == config.architecture) return e.make(config, weights, backend, options);
  }
  std::string known;
  for (const std::string& name : known_architectures()) known += (known.empty() ? "" : ", ") + name;
  throw LoadError("unknown architecture '" + config.architecture + "' (serval knows: " + known +
                  ")");
}

}  // namespace serval::model
