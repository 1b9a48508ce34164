// Added-token matching.
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include <utf8proc.h>

#include "tokenizer/utf8.h"

namespace serval::tokenizer {
namespace {

bool is_word_char(char32_t cp) {
  if (cp == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// Start of the character that ends at byte `end` (exclusive).
size_t prev_char_start(std::string_view s, size_t end) {
  size_t p = end - 1;
  while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
  return p;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<Entry> entries) : entries_(std::move(entries)) {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (!entries_[i].pattern.empty())
      by_first_byte_[static_cast<unsigned char>(entries_[i].pattern[0])].push_back(
          static_cast<int32_t>(i));
  for (auto& list : by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return entries_[a].pattern.size() > entries_[b].pattern.size();
    });
}

std::vector<AddedTokenMatcher::Span> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<Span> out;
  size_t plain_start = 0;  // start of the pending plain-text span
  for (size_t i = 0; i < text.size();) {
    const auto& candidates = by_first_byte_[static_cast<unsigned char>(text[i])];
    const Entry* hit = nullptr;
    for (int32_t idx : candidates) {
      const Entry& e = entries_[idx];
      if (text.compare(i, e.pattern.size(), e.pattern) == 0) {
        hit = &e;
        break;
      }
    }
    if (hit && hit->single_word) {
      const size_t end = i + hit->pattern.size();
      size_t p = end;
      const bool word_before = i > 0 && [&] {
        size_t q = prev_char_start(text, i);
        return is_word_char(utf8::next(text, q));
      }();
      const bool word_after = end < text.size() && is_word_char(utf8::next(text, p));
      if (word_before || word_after) hit = nullptr;
    }
    if (!hit) {
      i += utf8::char_len(static_cast<unsigned char>(text[i]));
      continue;
    }
    size_t b = i, e = i + hit->pattern.size();
    if (hit->lstrip) {
      while (b > plain_start) {
        size_t q = prev_char_start(text, b), r = q;
        if (!utf8::is_white_space(utf8::next(text, r))) break;
        b = q;
      }
    }
    if (hit->rstrip) {
      while (e < text.size()) {
        size_t r = e;
        if (!utf8::is_white_space(utf8::next(text, r))) break;
        e = r;
      }
    }
    if (b > plain_start) out.push_back({plain_start, b, -1});
    out.push_back({b, e, hit->id});
    plain_start = i = e;
  }
  if (plain_start < text.size()) out.push_back({plain_start, text.size(), -1});
  return out;
}

}  // namespace serval::tokenizer
