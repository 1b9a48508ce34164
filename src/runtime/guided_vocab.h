// The vocabulary seen by guided decoding: each token's bytes, sorted so that tokens sharing a
// prefix are neighbours (an implicit trie), and the mask of tokens a matcher (JsonMatcher,
// GbnfMatcher) accepts next.
//
// The mask walks the trie (built once, its children contiguous) depth first with a copy of the
// matcher per edge, pruning at the first rejected byte, so outside strings only the few
// plausible branches are visited. Inside a string
// (without a pattern or length limits) whole characters leave the state as it is: a token is
// then allowed outright when it is well-formed UTF-8 without '"', '\' or control bytes, and the
// others are fed from their first such byte or incomplete character.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/guided_output.h"

namespace serval::tokenizer {
class Tokenizer;
}

namespace serval::runtime {

class GuidedVocab {
 public:
  // texts[id]: the bytes token `id` adds to the output; tokens with `excluded[id]` (special
  // tokens: their text is kept for text()) or no text are never allowed.
  GuidedVocab(std::vector<std::string> texts, const std::vector<bool>& excluded);
  // From a tokenizer: each token's bytes (Tokenizer::token_bytes), special tokens excluded.
  static GuidedVocab from_tokenizer(const tokenizer::Tokenizer& tok);

  int size() const { return int(texts_.size()); }
  const std::string& text(int32_t id) const { return texts_[size_t(id)]; }

  // allowed[id] = 1 for every token whose bytes the matcher accepts (other entries untouched;
  // `allowed` must hold at least size() entries). A GBNF state's mask is walked once and
  // remembered with the state (GbnfMatcher::remembered_mask).
  void allow_accepted(const JsonMatcher& m, std::vector<uint8_t>& allowed) const;
  void allow_accepted(const GbnfMatcher& m, std::vector<uint8_t>& allowed) const;
  void allow_accepted(const OutputMatcher& m, std::vector<uint8_t>& allowed) const;

  // A mask as bits (bit id % 64 of word id / 64), and back: allowed[id] = 1 for each bit set.
  std::vector<uint64_t> pack(const std::vector<uint8_t>& allowed) const;
  void unpack(const std::vector<uint64_t>& bits, std::vector<uint8_t>& allowed) const;

 private:
  // A trie node: the tokens order_[begin, end) share its bytes, [begin, ends) end there; its
  // children are trie_[first_child, first_child + num_children), one per next byte.
  struct TrieNode {
    uint32_t begin, ends, end;
    uint32_t first_child;
    uint16_t num_children;
    uint8_t byte;  // the byte into this node (none for the root, trie_[0])
  };
  void build_trie();
  void visit(uint32_t node, size_t depth, const JsonMatcher& m,
             std::vector<uint8_t>& allowed) const;
  // The same walk for a GBNF matcher, by state numbers.
  void visit_states(uint32_t node, const GbnfMatcher& m, int32_t state,
                    std::vector<uint8_t>& allowed) const;
  void visit_plain_string(size_t begin, size_t end, size_t depth, const JsonMatcher& m,
                          std::vector<uint8_t>& allowed) const;
  const std::string& sorted_text(size_t i) const { return texts_[size_t(order_[i])]; }

  std::vector<std::string> texts_;
  std::vector<int32_t> order_;  // candidate ids sorted by their bytes
  std::vector<TrieNode> trie_;
  // per order_ entry: its first '"', '\', control byte or incomplete UTF-8 character
  std::vector<uint32_t> first_special_;
};

}  // namespace serval::runtime
