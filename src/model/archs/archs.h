// Factory functions of the architectures, one per file in this folder.
#pragma once
#include "model/model.h"

namespace serval::model {

using ArchFactory = std::unique_ptr<Model> (*)(const io::ModelConfig&, const WeightSource&,
                                               backend::Backend&, const LoadOptions&);

std::unique_ptr<Model> make_llama(const io::ModelConfig&, const WeightSource&, backend::Backend&,
                                  const LoadOptions&);
std::unique_ptr<Model> make_qwen3(const io::ModelConfig&, const WeightSource&, backend::Backend&,
                                  const LoadOptions&);
std::unique_ptr<Model> make_qwen3_moe(const io::ModelConfig&, const WeightSource&,
                                      backend::Backend&, const LoadOptions&);
std::unique_ptr<Model> make_mixtral(const io::ModelConfig&, const WeightSource&, backend::Backend&,
                                    const LoadOptions&);

}  // namespace serval::model
