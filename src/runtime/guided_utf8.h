// UTF-8 as guided decoding checks it byte by byte: well-formed sequences only (no overlong
// forms, no surrogates, nothing above U+10FFFF), as in Unicode's table of well-formed byte
// sequences.
#pragma once
#include <cstdint>
#include <string_view>
#include <utility>

namespace serval::runtime {

// The continuation bytes a first byte announces: 0 for ASCII, 1 to 3, or -1 when `c` cannot
// begin a character (a continuation byte, C0, C1, F5..FF).
constexpr int utf8_continuations(unsigned char c) {
  if (c < 0x80) return 0;
  if (c < 0xC2 || c > 0xF4) return -1;
  return c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
}

// The bytes that may follow `lead` as a character's second byte (later ones: 0x80..0xBF).
constexpr std::pair<unsigned char, unsigned char> utf8_second_byte_range(unsigned char lead) {
  switch (lead) {
    case 0xE0:
      return {0xA0, 0xBF};
    case 0xED:
      return {0x80, 0x9F};
    case 0xF0:
      return {0x90, 0xBF};
    case 0xF4:
      return {0x80, 0x8F};
    default:
      return {0x80, 0xBF};
  }
}

// Where the first character of `text` at or after `from` that is not complete, well-formed
// UTF-8 begins (text.size() when there is none).
constexpr size_t utf8_first_incomplete(std::string_view text, size_t from) {
  size_t i = from;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int more = utf8_continuations(c);
    if (more < 0 || i + size_t(more) >= text.size()) return i;
    if (more > 0) {
      const auto [lo, hi] = utf8_second_byte_range(c);
      const auto second = static_cast<unsigned char>(text[i + 1]);
      if (second < lo || second > hi) return i;
      for (int k = 2; k <= more; ++k)
        if ((static_cast<unsigned char>(text[i + size_t(k)]) & 0xC0) != 0x80) return i;
    }
    i += size_t(more) + 1;
  }
  return text.size();
}

}  // namespace serval::runtime
