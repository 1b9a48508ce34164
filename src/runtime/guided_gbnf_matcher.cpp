#include "runtime/guided_gbnf_matcher.h"

#include <algorithm>

namespace serval::runtime {

namespace {

using Kind = GbnfGrammar::Element::Kind;

// The continuation bytes that may follow `lead` as the second byte of a UTF-8 character (no
// overlong forms, no surrogates, nothing above U+10FFFF); later bytes take 0x80..0xBF.
std::pair<unsigned char, unsigned char> second_byte_range(unsigned char lead) {
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

}  // namespace

GbnfMatcher::GbnfMatcher(const GbnfGrammar& grammar) : grammar_(&grammar) {
  for (uint32_t start : grammar.rules[grammar.root]) {
    Stack stack;
    push_position(stack, start);
    expand(std::move(stack), stacks_);
  }
  std::sort(stacks_.begin(), stacks_.end());
  stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
  if (stacks_.size() > kMaxGbnfStacks) stacks_.resize(kMaxGbnfStacks);
}

void GbnfMatcher::push_position(Stack& stack, uint32_t position) const {
  if (grammar_->elements[position].kind != Kind::kEnd) stack.push_back(position);
}

void GbnfMatcher::expand(Stack stack, std::vector<Stack>& out) const {
  if (stack.empty() || grammar_->elements[stack.back()].kind == Kind::kChars) {
    out.push_back(std::move(stack));
    return;
  }
  // A rule on top: it is replaced by what follows it, then each alternative's first element.
  // The grammar has no left recursion, so this ends.
  const uint32_t top = stack.back();
  stack.pop_back();
  push_position(stack, top + 1);
  if (stack.size() >= kMaxGbnfDepth) return;
  const std::vector<uint32_t>& alternatives = grammar_->rules[grammar_->elements[top].ref];
  for (size_t i = 0; i < alternatives.size(); ++i) {
    Stack next = i + 1 == alternatives.size() ? std::move(stack) : stack;
    push_position(next, alternatives[i]);
    expand(std::move(next), out);
  }
}

bool GbnfMatcher::feed_code_point(uint32_t cp) {
  std::vector<Stack> next;
  for (const Stack& stack : stacks_) {
    if (stack.empty()) continue;
    const uint32_t top = stack.back();
    if (!grammar_->class_holds(grammar_->elements[top].ref, cp)) continue;
    Stack advanced(stack.begin(), stack.end() - 1);
    push_position(advanced, top + 1);
    expand(std::move(advanced), next);
  }
  if (next.empty()) return false;
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  if (next.size() > kMaxGbnfStacks) next.resize(kMaxGbnfStacks);
  stacks_ = std::move(next);
  return true;
}

bool GbnfMatcher::some_class_meets(uint32_t lo, uint32_t hi) const {
  return std::any_of(stacks_.begin(), stacks_.end(), [&](const Stack& stack) {
    return !stack.empty() && grammar_->class_meets(grammar_->elements[stack.back()].ref, lo, hi);
  });
}

bool GbnfMatcher::feed(unsigned char c) {
  if (missing_ == 0) {
    if (c < 0x80) return feed_code_point(c);
    if (c < 0xC2 || c > 0xF4) return false;  // a continuation byte, overlong lead, or past U+10FFFF
    missing_ = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    partial_ = c & (0x3Fu >> missing_);
    lead_ = c;
    taken_ = 1;
  } else {
    const auto [lo, hi] = taken_ == 1 ? second_byte_range(lead_)
                                      : std::pair<unsigned char, unsigned char>{0x80, 0xBF};
    if (c < lo || c > hi) return false;
    partial_ = (partial_ << 6) | (c & 0x3Fu);
    --missing_;
    ++taken_;
    if (missing_ == 0) return feed_code_point(partial_);
  }
  // The characters this prefix can still become: the missing bits all 0 through all 1, within
  // the scalar values of its length (the second-byte ranges above make that exact from the
  // second byte on; a lone lead byte needs the bounds).
  static constexpr uint32_t kMinOfLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  const uint32_t lo = std::max(partial_ << (6 * missing_), kMinOfLength[taken_ + missing_]);
  const uint32_t hi =
      std::min(lo | ((1u << (6 * missing_)) - 1), lead_ == 0xED ? 0xD7FFu : kMaxCodePoint);
  return some_class_meets(lo, hi);
}

bool GbnfMatcher::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(static_cast<unsigned char>(c))) return false;
  return true;
}

bool GbnfMatcher::done() const {
  return missing_ == 0 && stacks_.size() == 1 && stacks_[0].empty();
}

bool GbnfMatcher::can_end() const {
  return missing_ == 0 && !stacks_.empty() && stacks_[0].empty();  // sorted: empty first
}

}  // namespace serval::runtime
