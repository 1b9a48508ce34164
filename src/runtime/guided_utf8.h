// UTF-8 as guided decoding checks it byte by byte, as bytes arrive: well-formed sequences only
// (no overlong forms, no surrogates, nothing above U+10FFFF), as in Unicode's table of
// well-formed byte sequences. (Whole strings: tokenizer/utf8.h.)
#pragma once
#include <cstdint>
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

}  // namespace serval::runtime
