// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Split, ByteLevel,
// Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation and Sequence.
// They cut a normalized string into words; ByteLevel also maps every byte to
// its GPT-2 printable character.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::tokenizer {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `words` (valid UTF-8, non-empty) by their pieces, dropping empty
  // ones. `first_section` says whether they start the input (Metaspace "first").
  virtual void pre_tokenize(std::vector<std::string>& words, bool first_section) const = 0;
};

// Null JSON gives nullptr. Throws LoadError on unsupported types.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config);

// GPT-2's byte → printable character table (UTF-8 strings) and its inverse
// (code point → byte, -1 where a code point is not in the table).
const std::string& byte_to_unicode(unsigned char b);
int unicode_to_byte(char32_t cp);

}  // namespace serval::tokenizer
