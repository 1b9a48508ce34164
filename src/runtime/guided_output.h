// A request's guided output: the matcher its grammar calls for (JSON, choice and regex through
// JsonMatcher, GBNF through GbnfMatcher), guiding at once or only after the output's first
// "</think>".
#pragma once
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/guided_gbnf_matcher.h"
#include "runtime/guided_matcher.h"

namespace serval::runtime {

class GuidedVocab;

class OutputMatcher {
 public:
  // `grammar` must outlive the matcher; compact as for JsonMatcher.
  explicit OutputMatcher(const JsonGrammar& grammar, bool compact = false);

  // As JsonMatcher / GbnfMatcher: false (state unspecified) when the bytes do not fit.
  bool feed(std::string_view bytes) {
    return std::visit([&](auto& m) { return m.feed(bytes); }, matcher_);
  }
  bool done() const {
    return std::visit([](const auto& m) { return m.done(); }, matcher_);
  }
  bool can_end() const {
    return std::visit([](const auto& m) { return m.can_end(); }, matcher_);
  }
  // GbnfMatcher::trim (JSON matchers keep no tables).
  void trim();
  // The JsonMatcher inside, or null.
  const JsonMatcher* json() const { return std::get_if<JsonMatcher>(&matcher_); }
  // Calls f with the JsonMatcher or GbnfMatcher inside.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), matcher_);
  }

 private:
  std::variant<JsonMatcher, GbnfMatcher> matcher_;
};

// The matcher, guiding at once, or (after_think) only after the output's first "</think>",
// whose following bytes are the guided output's first; compact: JSON without blanks.
class GuidedOutput {
 public:
  GuidedOutput(const JsonGrammar& grammar, bool after_think, bool compact = false)
      : matcher_(grammar, compact), waiting_(after_think) {}
  // Whether the next token is masked by matcher().
  bool guiding() const { return !waiting_; }
  const OutputMatcher& matcher() const { return matcher_; }
  // Consumes a sampled token's text. False when guided bytes do not fit (a masked token always
  // does; the bytes after "</think>" may not, and are then left before the guided output).
  bool feed(std::string_view text);

  // allowed[id] = 1 for every token the output may take next (GuidedVocab::allow_accepted),
  // reusing the mask of an earlier step that left the matcher in the same state: the last
  // kRememberedJsonMasks JSON states here (inside a string the state recurs token after token),
  // GBNF states in their own table.
  void allow_next(const GuidedVocab& vocab, std::vector<uint8_t>& allowed);

 private:
  struct RememberedMask {
    JsonMatcher state;
    std::vector<uint64_t> bits;  // GuidedVocab::pack
  };
  static constexpr size_t kRememberedJsonMasks = 8;

  OutputMatcher matcher_;
  bool waiting_;
  std::string tail_;  // the output's last bytes while waiting (a tag split across tokens)
  std::vector<RememberedMask> json_masks_;  // oldest first
};

}  // namespace serval::runtime
