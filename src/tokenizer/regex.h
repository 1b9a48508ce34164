// A compiled PCRE2 pattern (UTF + UCP + JIT) with Oniguruma-compatible \s,
// used by the Split pre-tokenizer and the Replace normalizer/decoder.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace serval::tokenizer {

class Regex {
 public:
  // Throws LoadError when `pattern` does not compile; `where` names its origin.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping match in `text` (valid UTF-8) as [begin, end) byte
  // ranges, left to right. An empty match advances by one character.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Rewrites \s and \S into explicit Unicode White_Space sets: PCRE2's UCP \s
// adds U+180E, which Oniguruma (HF tokenizers' engine) does not match.
std::string rewrite_whitespace_classes(std::string_view pattern);

}  // namespace serval::tokenizer
