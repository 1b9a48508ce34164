#include "runtime/guided_gbnf_matcher.h"

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/guided_utf8.h"

namespace serval::runtime {

namespace {

using Kind = GbnfGrammar::Element::Kind;
using Stack = std::vector<uint32_t>;

// What a state is: the open stacks (sorted, distinct) and the UTF-8 character in progress (its
// bits so far, the bytes still to come, its first byte and how many of its bytes were taken).
struct Configuration {
  std::vector<Stack> stacks;
  uint32_t partial = 0;
  uint8_t missing = 0;
  uint8_t lead = 0;
  uint8_t taken = 0;

  // The table's key: every field, serialized.
  std::string key() const {
    std::string k;
    auto put = [&k](uint32_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
    put(partial);
    put(uint32_t(missing) | uint32_t(lead) << 8 | uint32_t(taken) << 16);
    for (const Stack& s : stacks) {
      put(uint32_t(s.size()));
      for (uint32_t p : s) put(p);
    }
    return k;
  }
};

void push_position(const GbnfGrammar& g, Stack& stack, uint32_t position) {
  if (g.elements[position].kind != Kind::kEnd) stack.push_back(position);
}

// The stacks one step of the matcher expands into, and every stack met on the way: a stack met
// twice (through alternatives that match nothing alike, `x ::= "" | ""`) expands once, so the
// work stays polynomial; past kMaxGbnfExpansions stacks the rest is dropped.
struct Expansion {
  std::vector<Stack> out;  // every top a class, or empty
  std::set<Stack> seen;
};

// Adds the stacks `stack` expands into to `e.out`.
void expand(const GbnfGrammar& g, Stack stack, Expansion& e) {
  if (e.seen.size() >= kMaxGbnfExpansions || !e.seen.insert(stack).second) return;
  if (stack.empty() || g.elements[stack.back()].kind == Kind::kChars) {
    e.out.push_back(std::move(stack));
    return;
  }
  // A rule on top: it is replaced by what follows it, then each alternative's first element.
  // The grammar has no left recursion, so this ends.
  const uint32_t top = stack.back();
  stack.pop_back();
  push_position(g, stack, top + 1);
  if (stack.size() >= kMaxGbnfDepth) return;
  const std::vector<uint32_t>& alternatives = g.rules[g.elements[top].ref];
  for (size_t i = 0; i < alternatives.size(); ++i) {
    Stack next = i + 1 == alternatives.size() ? std::move(stack) : stack;
    push_position(g, next, alternatives[i]);
    expand(g, std::move(next), e);
  }
}

// Sorted, duplicates dropped, at most kMaxGbnfStacks (the first ones).
std::vector<Stack> distinct(std::vector<Stack> stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > kMaxGbnfStacks) stacks.resize(kMaxGbnfStacks);
  return stacks;
}

}  // namespace

// The states found so far and their transitions, numbered from 0 (the state of the matcher
// that created the table).
class GbnfStates {
 public:
  static constexpr int32_t kUnknown = -2, kRejected = -1;

  GbnfStates(const GbnfGrammar& grammar, Configuration first) : grammar_(grammar) {
    intern(std::move(first));
  }

  const GbnfGrammar& grammar() const { return grammar_; }
  size_t size() const { return states_.size(); }
  const Configuration& configuration(int32_t s) const { return states_[size_t(s)].config; }
  bool can_end(int32_t s) const { return states_[size_t(s)].can_end; }
  const std::vector<uint64_t>* mask(int32_t s) const { return states_[size_t(s)].mask.get(); }
  // Keeps `bits` as state s's mask, forgetting the oldest kept beyond kMaxGbnfMasks.
  void set_mask(int32_t s, std::vector<uint64_t> bits) {
    if (masked_.size() == kMaxGbnfMasks) {
      states_[size_t(masked_.front())].mask.reset();
      masked_.erase(masked_.begin());
    }
    states_[size_t(s)].mask = std::make_unique<std::vector<uint64_t>>(std::move(bits));
    masked_.push_back(s);
  }
  bool done(int32_t s) const { return states_[size_t(s)].done; }

  // The state after byte c, or kRejected.
  int32_t step(int32_t s, unsigned char c) {
    State& state = states_[size_t(s)];
    if (!state.next) {
      state.next = std::make_unique<std::array<int32_t, 256>>();
      state.next->fill(kUnknown);
    }
    int32_t& next = (*state.next)[c];
    if (next == kUnknown) {
      Configuration after = state.config;
      const int32_t found = advance(after, c) ? intern(std::move(after)) : kRejected;
      (*states_[size_t(s)].next)[c] = found;  // states_ may have grown: index again
      return found;
    }
    return next;
  }

 private:
  struct State {
    Configuration config;
    bool can_end = false, done = false;
    std::unique_ptr<std::array<int32_t, 256>> next;  // per byte; made at the first step
    std::unique_ptr<std::vector<uint64_t>> mask;     // see GbnfMatcher::remembered_mask
  };

  int32_t intern(Configuration config) {
    const auto [it, added] = index_.try_emplace(config.key(), int32_t(states_.size()));
    if (added) {
      State s;
      const bool idle = config.missing == 0;
      s.can_end = idle && !config.stacks.empty() && config.stacks[0].empty();  // sorted: first
      s.done = idle && config.stacks.size() == 1 && config.stacks[0].empty();
      s.config = std::move(config);
      states_.push_back(std::move(s));
    }
    return it->second;
  }

  // Byte c applied to `config`; false when no stack continues with it.
  bool advance(Configuration& config, unsigned char c) const {
    if (config.missing == 0) {
      const int more = utf8_continuations(c);
      if (more == 0) return feed_code_point(config, c);
      if (more < 0) return false;
      config.missing = uint8_t(more);
      config.partial = c & (0x3Fu >> config.missing);
      config.lead = c;
      config.taken = 1;
    } else {
      const auto [lo, hi] = config.taken == 1 ? utf8_second_byte_range(config.lead)
                                              : std::pair<unsigned char, unsigned char>{0x80, 0xBF};
      if (c < lo || c > hi) return false;
      config.partial = (config.partial << 6) | (c & 0x3Fu);
      --config.missing;
      ++config.taken;
      if (config.missing == 0) {
        const uint32_t cp = config.partial;
        config.partial = config.lead = config.taken = 0;
        return feed_code_point(config, cp);
      }
    }
    // The characters this prefix can still become: the missing bits all 0 through all 1, within
    // the scalar values of its length (the second-byte ranges above make that exact from the
    // second byte on; a lone lead byte needs the bounds).
    static constexpr uint32_t kMinOfLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    const uint32_t lo = std::max(config.partial << (6 * config.missing),
                                 kMinOfLength[config.taken + config.missing]);
    const uint32_t hi = std::min(lo | ((1u << (6 * config.missing)) - 1),
                                 config.lead == 0xED ? 0xD7FFu : kMaxCodePoint);
    return std::any_of(config.stacks.begin(), config.stacks.end(), [&](const Stack& stack) {
      return !stack.empty() && grammar_.class_meets(grammar_.elements[stack.back()].ref, lo, hi);
    });
  }

  bool feed_code_point(Configuration& config, uint32_t cp) const {
    Expansion next;
    for (const Stack& stack : config.stacks) {
      if (stack.empty()) continue;
      const uint32_t top = stack.back();
      if (!grammar_.class_holds(grammar_.elements[top].ref, cp)) continue;
      Stack advanced(stack.begin(), stack.end() - 1);
      push_position(grammar_, advanced, top + 1);
      expand(grammar_, std::move(advanced), next);
    }
    if (next.out.empty()) return false;
    config.stacks = distinct(std::move(next.out));
    return true;
  }

 private:
  const GbnfGrammar& grammar_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> index_;
  std::vector<int32_t> masked_;  // states with a mask, oldest first
};

GbnfMatcher::GbnfMatcher(const GbnfGrammar& grammar) {
  Expansion first;
  for (uint32_t alternative : grammar.rules[grammar.root]) {
    Stack stack;
    push_position(grammar, stack, alternative);
    expand(grammar, std::move(stack), first);
  }
  Configuration start;
  start.stacks = distinct(std::move(first.out));
  states_ = std::make_shared<GbnfStates>(grammar, std::move(start));
}

int32_t GbnfMatcher::step(int32_t from, unsigned char c) const {
  return states_->step(from, c);
}

bool GbnfMatcher::feed(unsigned char c) {
  const int32_t next = states_->step(state_, c);
  if (next == GbnfStates::kRejected) return false;
  state_ = next;
  return true;
}

bool GbnfMatcher::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(static_cast<unsigned char>(c))) return false;
  return true;
}

bool GbnfMatcher::done() const {
  return states_->done(state_);
}

bool GbnfMatcher::can_end() const {
  return states_->can_end(state_);
}

void GbnfMatcher::trim() {
  if (states_->size() <= kMaxGbnfStates || states_.use_count() > 1) return;
  states_ = std::make_shared<GbnfStates>(states_->grammar(), states_->configuration(state_));
  state_ = 0;
}

size_t GbnfMatcher::num_states() const {
  return states_->size();
}

const std::vector<uint64_t>* GbnfMatcher::remembered_mask() const {
  return states_->mask(state_);
}

void GbnfMatcher::remember_mask(std::vector<uint64_t> bits) const {
  if (!states_->mask(state_)) states_->set_mask(state_, std::move(bits));
}

}  // namespace serval::runtime
