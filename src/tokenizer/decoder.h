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
  // piece: the tokens are a piece from the middle of a longer output, decoded to what they add
  // to it byte for byte: byte tokens (ByteLevel, ByteFallback) keep their bytes even where they
  // are not valid UTF-8 alone (instead of U+FFFD), and the output's first-space strips
  // (Metaspace's prepended space, Strip) are not applied.
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                                bool piece) const = 0;
};

// Null JSON gives nullptr. Throws LoadError on unsupported types.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config);

// transformers' clean_up_tokenization: drops the space before . ? ! , and
// English contractions (" n't", " 's", ...).
std::string clean_up_tokenization(std::string text);

}  // namespace serval::tokenizer
