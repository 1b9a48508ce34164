// PCRE2 wrapper.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <fmt/format.h>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace serval::tokenizer {
namespace {

constexpr std::string_view kWhiteSpaceItems =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

}  // namespace

std::string rewrite_whitespace_classes(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's' && in_class) {
        out.append(kWhiteSpaceItems);
      } else if (e == 's') {
        out.append("[").append(kWhiteSpaceItems).append("]");
      } else if (e == 'S' && !in_class) {
        out.append("[^").append(kWhiteSpaceItems).append("]");
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(new Impl) {
  const std::string rewritten = rewrite_whitespace_classes(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw LoadError(fmt::format("{}: regex '{}' does not compile at offset {}: {}", where, pattern,
                                err_off, reinterpret_cast<const char*>(msg)));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), pos,
                                                PCRE2_NO_UTF_CHECK, md, nullptr)
                              : pcre2_match(impl_->code, subject, text.size(), pos,
                                            PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH or a resource limit: no more matches
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {
      if (b >= text.size()) break;
      pos = b + utf8::char_len(static_cast<unsigned char>(text[b]));
    }
  }
  pcre2_match_data_free(md);
  return out;
}

}  // namespace serval::tokenizer
