// UTF-8 helpers for the tokenizer: validation with byte offsets, code point
// iteration and WHATWG/Rust-compatible lossy decoding of byte strings.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace serval::tokenizer::utf8 {

inline constexpr size_t kValid = static_cast<size_t>(-1);

// Byte offset of the first byte that does not start a well-formed UTF-8
// sequence (overlongs, surrogates and code points above U+10FFFF are
// ill-formed), or kValid.
size_t find_invalid(std::string_view s);

// Throws InvalidArgument naming the byte offset when `s` is not valid UTF-8.
// `what` names the input in the message ("text", "token 12").
void validate(std::string_view s, std::string_view what = "text");

// Length in bytes of the character starting with lead byte `b` (1 for
// continuation or invalid bytes, so that iteration always advances).
inline size_t char_len(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at s[pos] of valid UTF-8 and advances pos.
char32_t next(std::string_view s, size_t& pos);

// Appends the UTF-8 encoding of `cp`.
void append(std::string& out, char32_t cp);

// Decodes arbitrary bytes, replacing each maximal ill-formed subpart with
// U+FFFD (what Rust's String::from_utf8_lossy and WHATWG TextDecoder do).
std::string decode_lossy(std::string_view bytes);

// Unicode White_Space property (what Oniguruma's and Rust's \s / is_whitespace use).
bool is_white_space(char32_t cp);

}  // namespace serval::tokenizer::utf8
