// IncrementalDetokenizer: decodes a sliding window of ids and emits the text
// beyond what the window's already-emitted prefix decodes to. The prefix keeps
// the last emitted ids, so context-dependent decoders (SentencePiece's leading
// space strip, byte-level UTF-8 joins) see the same neighbours as a one-shot
// decode.
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace serval::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  window_.push_back(id);
  const std::string text = tok_.decode(window_, skip_special_);
  // A trailing U+FFFD may be an unfinished multi-byte character: hold it back.
  if (text.size() <= prefix_text_.size() || text.ends_with(kReplacement) ||
      !text.starts_with(prefix_text_))
    return {};
  std::string fresh = text.substr(prefix_text_.size());
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(read_));
  read_ = window_.size();
  prefix_text_ = tok_.decode(window_, skip_special_);
  return fresh;
}

std::string IncrementalDetokenizer::finish() {
  const std::string text = tok_.decode(window_, skip_special_);
  std::string rest;
  if (text.size() > prefix_text_.size() && text.starts_with(prefix_text_))
    rest = text.substr(prefix_text_.size());
  window_.clear();
  read_ = 0;
  prefix_text_.clear();
  return rest;
}

}  // namespace serval::tokenizer
