// guided_regex: the whole output must match a regular expression, matched byte by byte by a
// position (Glushkov) automaton whose state set fits one 64-bit word.
//
// The syntax is the common subset of Python's and ECMAScript's: literals, '.', classes
// ([a-z0-9_], [^...]), \d \w \s and their negations, escaped punctuation, \n \t \r, groups
// ( ), (?: ), (?P<name> ), alternation |, quantifiers * + ? {n} {n,} {n,m} (a lazy '?' after one
// changes nothing here), and ^ / $ at the ends (the match is of the whole output anyway).
// Matching is on bytes: '.' and negated classes take one byte, so a non-ASCII character needs
// one per byte of its UTF-8 encoding. At most 63 positions (class occurrences, {n,m} copies
// counted); anything else is refused with where it is.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace serval::runtime {

struct RegexAutomaton {
  static constexpr int kMaxPositions = 63;
  static constexpr uint64_t kStart = uint64_t{1} << 63;  // the state before any byte

  uint64_t first = 0, last = 0;                // positions that can begin / end a match
  bool nullable = false;                       // the empty output matches
  std::vector<uint64_t> follow;                // per position: the positions that can come next
  std::array<uint64_t, 256> byte_positions{};  // per byte: the positions whose class holds it

  // The state after byte c (0: no match can continue with it).
  uint64_t step(uint64_t state, unsigned char c) const;
  bool can_end(uint64_t state) const;
  bool can_continue(uint64_t state) const;

 private:
  uint64_t reach(uint64_t state) const;  // the positions a next byte may take
};

// Throws InvalidArgument naming the offset and what is wrong or not supported.
RegexAutomaton compile_regex(std::string_view pattern);

}  // namespace serval::runtime
