// Normalizers of tokenizer.json ("normalizer"): NFC, NFD, NFKC, NFKD,
// Lowercase, Strip, Prepend, Replace and Sequence, on whole UTF-8 strings.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace serval::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8; the result is valid UTF-8.
  virtual std::string normalize(std::string_view text) const = 0;
};

// Builds the normalizer described by `config`; null JSON gives nullptr.
// Throws LoadError naming the unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config);

}  // namespace serval::tokenizer
