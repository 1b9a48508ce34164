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

  // The bytes token `id` adds in the middle of an output: as decode({id}, false), except that
  // byte tokens keep their bytes where they are not valid UTF-8 alone (one byte of a multi-byte
  // character; decode() renders U+FFFD) and a leading space (SentencePiece's '▁') is kept.
  // Guided decoding matches these.
  std::string token_bytes(int32_t id) const;

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
  // The decoder's text of these token strings (space-joined without a decoder); `piece` as in
  // Decoder::decode_chain.
  std::string join_decoded(std::vector<std::string> tokens, bool piece) const;
  std::unique_ptr<Impl> impl_;
};

// Streams text out of generated ids. The concatenation of every push() and
// finish() equals Tokenizer::decode of all ids (same skip_special_tokens),
// byte for byte. push() returns the text that no later id can change: it
// holds back a trailing incomplete UTF-8 sequence (at most 3 bytes) and, for
// SentencePiece byte fallback (where one invalid byte turns its whole run of
// <0xNN> tokens into U+FFFD), a still-valid run of byte tokens. Byte runs that
// can never become valid are emitted as the U+FFFD that decode() renders.
// Cost per id is O(1) amortized: decode() runs on a short window of recent ids.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens);
  // Throws InvalidArgument for ids outside the vocab (the state is unchanged).
  std::string push(int32_t id);  // new text that is safe to emit
  std::string finish();          // whatever is held back; resets the stream

 private:
  // decode(ids + tail).
  std::string decode_with(std::span<const int32_t> ids, std::span<const int32_t> tail) const;
  // Continuations that a later id could bring and that would change text
  // already decoded (see detokenizer.cpp); `text` is decode(window_).
  std::vector<std::span<const int32_t>> probes(std::string_view text, bool all) const;
  // Tries to drop leading ids from window_ without changing what the window
  // decodes to after them, now or after any probe continuation.
  void shrink();

  const Tokenizer& tok_;
  bool skip_special_;
  bool byte_runs_ = false;  // byte tokens decode per run (ByteFallback)
  // Probe continuations made of byte tokens; empty when the vocabulary has none.
  std::vector<std::vector<int32_t>> completions_;  // bytes that complete a UTF-8 prefix
  std::vector<int32_t> invalid_byte_;              // one byte that is never valid UTF-8
  std::vector<int32_t> ascii_byte_;                // one ASCII byte (byte runs only)
  // The latest pushed ids after a few context ids (pushed ones, or a
  // synthetic invalid byte); decode(window_) == text_, whose first `emitted_`
  // bytes were returned. Past the context, text_ is the end of the one-shot
  // decode of all pushed ids (shrink() checks this when it picks a context).
  std::vector<int32_t> window_;
  std::string text_;
  size_t emitted_ = 0;
  size_t shrink_at_;  // window size at which shrink() runs next
};

}  // namespace serval::tokenizer
