// Tokenizer: a Hugging Face tokenizer.json (BPE, byte-level or
// SentencePiece-style) plus tokenizer_config.json metadata. encode/decode
// match HF tokenizers; the object is immutable after loading and thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace serval::tokenizer {

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json and (optional) model_dir/tokenizer_config.json.
  // Throws LoadError on missing or malformed files.
  static std::unique_ptr<Tokenizer> load(const std::string& model_dir);
  // `tokenizer_config_json` may be empty.
  static std::unique_ptr<Tokenizer> from_json(const std::string& tokenizer_json,
                                              const std::string& tokenizer_config_json);
  ~Tokenizer();

  // Throws InvalidArgument naming the byte offset when `text` is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Throws InvalidArgument for ids outside the vocab. With `clean_up_spaces`
  // also applies transformers' clean_up_tokenization (see
  // clean_up_tokenization_spaces() for the model's own setting).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true,
                     bool clean_up_spaces = false) const;

  int vocab_size() const;  // including added tokens (max id + 1)
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // raw vocab string; empty if unknown
  bool is_special(int32_t id) const;

  // From tokenizer_config.json (strings or {"content": ...}); empty if unset.
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> bos_token_id() const;
  // tokenizer_config.json "chat_template" (string, or list of {name, template}:
  // the "default" one); empty if none.
  const std::string& chat_template_source() const;
  // tokenizer_config.json "clean_up_tokenization_spaces" (false if unset).
  bool clean_up_tokenization_spaces() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streams text out of generated ids. push() returns only complete UTF-8
// characters; the concatenation of every push() and finish() equals
// Tokenizer::decode of all ids (with the same skip_special_tokens).
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens);
  std::string push(int32_t id);  // new text that is safe to emit
  std::string finish();          // whatever is held back

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  // Ids from the start of the decode window; the first `read_` of them are
  // already emitted and decode to `prefix_text_`.
  std::vector<int32_t> window_;
  size_t read_ = 0;
  std::string prefix_text_;
};

}  // namespace serval::tokenizer
