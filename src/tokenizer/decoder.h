// Decoders of tokenizer.json ("decoder"): ByteLevel, Metaspace, ByteFallback,
// Fuse, Strip, Replace, BPEDecoder and Sequence, with HF tokenizers (Rust)
// semantics. A decoder maps token strings to text pieces; the caller joins them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // raw_bytes: byte tokens (ByteLevel, ByteFallback) give their bytes even where they are not
  // valid UTF-8, instead of U+FFFD (what one token adds to the output, byte for byte).
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                                bool raw_bytes) const = 0;
};

// Null JSON gives nullptr. Throws LoadError on unsupported types.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config);

// transformers' clean_up_tokenization: drops the space before . ? ! , and
// English contractions (" n't", " 's", ...).
std::string clean_up_tokenization(std::string text);

}  // namespace serval::tokenizer
