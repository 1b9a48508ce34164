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
// Each distinct set of stacks (with the UTF-8 character in progress) is a state, numbered once
// and shared by a matcher and its copies with the transitions found so far, so that copying a
// matcher and feeding it a byte seen before from the same state are a few loads: token masks
// walk the vocabulary through states that recur (a loop over a class returns to its state).
//
// A state also keeps the token mask computed for it (GuidedVocab), for the most recent
// kMaxGbnfMasks states: a state the output comes back to (the next word of a list) costs no walk.
//
// Limits: at most kMaxGbnfStacks ways at once (an ambiguous grammar beyond that keeps the first
// ones, which can only narrow the outputs allowed), kMaxGbnfDepth positions per stack (deeper
// nesting is refused) and kMaxGbnfExpansions stacks met per character.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/guided_gbnf.h"

namespace serval::runtime {

inline constexpr size_t kMaxGbnfStacks = 64;
inline constexpr size_t kMaxGbnfDepth = 256;
// Stacks met while expanding rules for one character (beyond: dropped, narrowing).
inline constexpr size_t kMaxGbnfExpansions = 4096;
// States kept before trim() starts afresh from the current one.
inline constexpr size_t kMaxGbnfStates = 1 << 14;
inline constexpr size_t kMaxGbnfMasks = 32;

class GbnfStates;

class GbnfMatcher {
 public:
  // `grammar` must outlive the matcher and its copies. Copies share the state table: use them
  // on one thread.
  explicit GbnfMatcher(const GbnfGrammar& grammar);

  // Consumes byte `c`; false (the matcher unchanged) when no sentence continues with it.
  bool feed(unsigned char c);
  // False when some byte does not fit (the matcher then in an unspecified state).
  bool feed(std::string_view bytes);

  // The sentence is complete and nothing may follow.
  bool done() const;
  // The text so far is a sentence of the grammar.
  bool can_end() const;

  // The current state's number, and the state after byte c from state `from` (-1: rejected;
  // both numbers of this matcher's table): token masks walk states without copying matchers.
  int32_t state() const { return state_; }
  int32_t step(int32_t from, unsigned char c) const;

  // Forgets the states found so far when there are more than kMaxGbnfStates, keeping this
  // matcher's; does nothing while a copy shares them.
  void trim();
  size_t num_states() const;

  // The token mask remembered for the current state (a bit per token id: bit id % 64 of word
  // id / 64), or null. remember_mask stores one (shared by the copies: the const is the
  // matcher's position, which it leaves alone).
  const std::vector<uint64_t>* remembered_mask() const;
  void remember_mask(std::vector<uint64_t> bits) const;

 private:
  std::shared_ptr<GbnfStates> states_;
  int32_t state_ = 0;
};

}  // namespace serval::runtime
