// Byte-level matcher of the output against a GBNF grammar (guided_gbnf.h): the set of parse
// stacks the text so far leaves open, advanced one byte at a time.
//
// A stack lists grammar positions (indices into GbnfGrammar::elements), the innermost last; its
// top is always a character class, or the stack is empty (the sentence may end). Rules are
// expanded top-down when they reach the top, and a rule's last element is not kept below the
// rules it expands, so right recursion (x ::= "a" x | "") does not deepen the stack.
// Characters are code points: the bytes of a multi-byte UTF-8 character are taken while some
// open class still holds a character they can complete (invalid UTF-8 is refused).
//
// Limits: at most kMaxGbnfStacks ways at once (an ambiguous grammar beyond that keeps the first
// ones, which can only narrow the outputs allowed) and kMaxGbnfDepth positions per stack
// (deeper nesting is refused).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "runtime/guided_gbnf.h"

namespace serval::runtime {

inline constexpr size_t kMaxGbnfStacks = 64;
inline constexpr size_t kMaxGbnfDepth = 256;

class GbnfMatcher {
 public:
  // `grammar` must outlive the matcher.
  explicit GbnfMatcher(const GbnfGrammar& grammar);

  // Consumes byte `c`; false (and the matcher left in an unspecified state) when no sentence
  // continues with it: copy the matcher first to try.
  bool feed(unsigned char c);
  bool feed(std::string_view bytes);

  // The sentence is complete and nothing may follow.
  bool done() const;
  // The text so far is a sentence of the grammar.
  bool can_end() const;

 private:
  using Stack = std::vector<uint32_t>;
  bool feed_code_point(uint32_t cp);
  // Whether some stack's class holds a code point in lo..hi.
  bool some_class_meets(uint32_t lo, uint32_t hi) const;
  // Adds the stacks `stack` expands into (every top a class, or empty) to `out`.
  void expand(Stack stack, std::vector<Stack>& out) const;
  void push_position(Stack& stack, uint32_t position) const;

  const GbnfGrammar* grammar_;
  std::vector<Stack> stacks_;  // sorted, distinct
  // A UTF-8 character in progress: its bits so far, the bytes still to come, its first byte
  // and how many of its bytes were taken.
  uint32_t partial_ = 0;
  uint8_t missing_ = 0;
  uint8_t lead_ = 0;
  uint8_t taken_ = 0;
};

}  // namespace serval::runtime
