// Factory functions of the architectures, one per file in this folder.
#pragma once
#include <functional>
#include <optional>

#include "model/layers/layers.h"
#include "model/model.h"

namespace serval::model {

using ArchFactory = std::unique_ptr<Model> (*)(const io::ModelConfig&, const WeightSource&,
                                               backend::Backend&, const LoadOptions&);

// The MoE layers of the Qwen MoE families ("model.layers.N.mlp": router "gate", experts
// "experts.E.{gate,up,down}_proj"), on the layers ModelConfig::is_moe_layer picks. `c` must
// outlive the function.
std::function<std::optional<MoeNames>(int)> qwen_moe_names(const io::ModelConfig& c);

std::unique_ptr<Model> make_llama(const io::ModelConfig&, const WeightSource&, backend::Backend&,
                                  const LoadOptions&);
std::unique_ptr<Model> make_qwen2_moe(const io::ModelConfig&, const WeightSource&,
                                      backend::Backend&, const LoadOptions&);
std::unique_ptr<Model> make_qwen3(const io::ModelConfig&, const WeightSource&, backend::Backend&,
                                  const LoadOptions&);
std::unique_ptr<Model> make_qwen3_moe(const io::ModelConfig&, const WeightSource&,
                                      backend::Backend&, const LoadOptions&);
std::unique_ptr<Model> make_deepseek(const io::ModelConfig&, const WeightSource&,
                                     backend::Backend&, const LoadOptions&);
std::unique_ptr<Model> make_mixtral(const io::ModelConfig&, const WeightSource&, backend::Backend&,
                                    const LoadOptions&);

}  // namespace serval::model
