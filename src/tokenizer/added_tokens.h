// Added tokens (tokenizer.json "added_tokens") and the matcher that splits
// them out of text before normalization and BPE, leftmost-longest, honouring
// the lstrip, rstrip and single_word flags.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace serval::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool normalized = false;   // matched after normalization (on normalized text)
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool single_word = false;  // only matches when not inside a word
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text to find for token `ids[i]`, with its flags.
  struct Entry {
    std::string pattern;
    int32_t id;
    bool lstrip, rstrip, single_word;
  };
  explicit AddedTokenMatcher(std::vector<Entry> entries);

  // A span of the input: an added token (id >= 0, span includes stripped
  // whitespace) or plain text (id == -1). Spans cover the input in order.
  struct Span {
    size_t begin, end;
    int32_t id;
  };
  std::vector<Span> split(std::string_view text) const;
  bool empty() const { return entries_.empty(); }

 private:
  std::vector<Entry> entries_;
  std::vector<int32_t> by_first_byte_[256];  // entry indices, longest pattern first
};

}  // namespace serval::tokenizer
