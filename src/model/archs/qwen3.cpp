// Qwen3ForCausalLM: Llama plus a per-head RMSNorm of q and k before RoPE.
#include "model/archs/archs.h"
#include "model/decoder.h"

namespace serval::model {

std::unique_ptr<Model> make_qwen3(const io::ModelConfig& c, const WeightSource& w,
                                  backend::Backend& b, const LoadOptions& o) {
  DecoderSpec spec;
  spec.qk_norm = true;
  return std::make_unique<Decoder>(c, spec, w, b, o);
}

}  // namespace serval::model
