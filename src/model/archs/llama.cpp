// LlamaForCausalLM: the plain pre-norm decoder; Llama-3 rope scaling comes from the config.
#include "model/archs/archs.h"
#include "model/decoder.h"

namespace serval::model {

std::unique_ptr<Model> make_llama(const io::ModelConfig& c, const WeightSource& w,
                                  backend::Backend& b, const LoadOptions& o) {
  return std::make_unique<Decoder>(c, DecoderSpec{}, w, b, o);
}

}  // namespace serval::model
