// guided_grammar: the output must be a sentence of a context-free grammar written in GBNF, the
// EBNF dialect of llama.cpp and xgrammar that vLLM's guided_grammar takes:
//
//   root   ::= answer ("," ws answer)*      # the start rule is `root`
//   answer ::= "yes" | "no" | [0-9]+ | [^,\n]{1,8}
//   ws     ::= [ \t]*
//
// Rules `name ::= alternatives` (names of letters, digits, '-' and '_'; a rule may span lines,
// and ends where the next `name ::=` begins); string literals "…" and character classes [a-z],
// [^…] with the escapes \n \r \t \\ \" \' \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH; '.' (any
// character); groups ( ); alternation |; repetition * + ? {m} {m,} {m,n}; comments from '#'.
// Characters are Unicode code points (the output's UTF-8 is matched byte by byte, a multi-byte
// character allowed as far as some character of the class can still complete it).
//
// Refused, with the line and column: syntax errors, an undefined rule (or no `root`), a rule
// defined twice, groups nested over kMaxGbnfNesting deep, a chain of over kMaxGbnfChain rules
// before any character, and left recursion (a rule reaching itself before any character, as in
// `expr ::= expr "+" term`, or a repetition of something that can be empty) — the matcher
// expands rules top-down and would not terminate on those.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace serval::runtime {

struct GbnfGrammar {
  struct Element {
    enum class Kind : uint8_t { kChars, kRule, kEnd };
    Kind kind;
    uint32_t ref;  // kChars: index into classes; kRule: index into rules; kEnd: unused
  };
  using Range = std::pair<uint32_t, uint32_t>;  // code points lo..hi, inclusive

  // Every alternative of every rule, each a run of kChars / kRule elements closed by a kEnd.
  std::vector<Element> elements;
  // Per rule: the index in `elements` where each of its alternatives begins.
  std::vector<std::vector<uint32_t>> rules;
  std::vector<std::string> rule_names;  // helper rules of groups and repetitions: "rule#n"
  // Per class: sorted, disjoint, non-adjacent ranges (a negated class is stored complemented).
  std::vector<std::vector<Range>> classes;
  uint32_t root = 0;

  bool class_holds(uint32_t cls, uint32_t code_point) const;
  // Whether the class holds some code point in lo..hi.
  bool class_meets(uint32_t cls, uint32_t lo, uint32_t hi) const;
};

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr int kMaxGbnfRepeat = 1000;          // the largest m or n of {m,n}
inline constexpr int kMaxGbnfNesting = 64;           // groups inside groups
inline constexpr size_t kMaxGbnfChain = 256;         // rules expanded before a character
inline constexpr size_t kMaxGbnfElements = 1 << 20;  // after repetitions are written out

// Throws InvalidArgument naming the line and column and what is wrong.
GbnfGrammar compile_gbnf(std::string_view text);

}  // namespace serval::runtime
