#include "runtime/guided_gbnf.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace serval::runtime {

namespace {

namespace utf8 = tokenizer::utf8;
using Element = GbnfGrammar::Element;
using Range = GbnfGrammar::Range;
using Sequence = std::vector<Element>;
using Alternatives = std::vector<Sequence>;

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// Sorted, disjoint, non-adjacent ranges covering what `ranges` covers.
std::vector<Range> normalized(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

// The code points 0..kMaxCodePoint that `ranges` (normalized) leave out.
std::vector<Range> complement(const std::vector<Range>& ranges) {
  std::vector<Range> out;
  uint32_t next = 0;
  for (const Range& r : ranges) {
    if (r.first > next) out.emplace_back(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

// Rules as they are parsed: alternatives of element runs, before they are laid out flat.
struct RuleDraft {
  std::string name;
  std::string parent;  // the rule written in the text (itself, unless a helper)
  Alternatives alternatives;
  bool defined = false;
  size_t first_use = 0;   // offset of the first reference (for errors)
  size_t defined_at = 0;  // offset of the definition (of the parent, for a helper)
};

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  GbnfGrammar parse() {
    if (const size_t bad = utf8::find_invalid(text_); bad != utf8::kValid)
      fail(bad, "invalid UTF-8 in the grammar");
    skip_space(/*newlines=*/true);
    while (pos_ < text_.size()) {
      parse_rule();
      skip_space(true);
    }
    return finish();
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw InvalidArgument(fmt::format("grammar line {}, column {}: {}", line, column, what));
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  // Blanks and '#' comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (!at_end() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        return;
      }
    }
  }

  std::string_view name_at(size_t at) const {
    size_t end = at;
    while (end < text_.size() && name_char(text_[end])) ++end;
    return text_.substr(at, end - at);
  }

  // Whether a `name ::=` begins at the current position (the start of the next rule).
  bool rule_starts_here() const {
    const std::string_view name = name_at(pos_);
    if (name.empty()) return false;
    size_t at = pos_ + name.size();
    while (at < text_.size() && (text_[at] == ' ' || text_[at] == '\t')) ++at;
    return text_.substr(at, 3) == "::=";
  }

  uint32_t rule_index(std::string_view name, size_t used_at) {
    const auto [it, added] = index_.try_emplace(std::string(name), uint32_t(drafts_.size()));
    if (added)
      drafts_.push_back(RuleDraft{std::string(name), std::string(name), {}, false, used_at, 0});
    return it->second;
  }

  void parse_rule() {
    const size_t start = pos_;
    const std::string_view name = name_at(pos_);
    if (name.empty()) fail(pos_, fmt::format("expected a rule name, found '{}'", peek()));
    pos_ += name.size();
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") fail(pos_, fmt::format("expected '::=' after '{}'", name));
    pos_ += 3;
    const uint32_t rule = rule_index(name, start);
    if (drafts_[rule].defined) fail(start, fmt::format("rule '{}' is defined twice", name));
    drafts_[rule].defined = true;
    drafts_[rule].defined_at = start;
    current_ = std::string(name);
    current_at_ = start;
    Alternatives alternatives = parse_alternatives(/*nested=*/false);
    drafts_[rule].alternatives = std::move(alternatives);
  }

  // Sequences separated by '|': up to ')' when nested, else up to the next rule or the end.
  Alternatives parse_alternatives(bool nested) {
    Alternatives out;
    out.push_back(parse_sequence(nested));
    while (peek() == '|') {
      ++pos_;
      out.push_back(parse_sequence(nested));
    }
    return out;
  }

  Sequence parse_sequence(bool nested) {
    Sequence seq;
    for (;;) {
      skip_space(true);
      if (at_end() || peek() == '|' || peek() == ')') break;
      if (!nested && rule_starts_here()) break;
      Sequence item = parse_item();
      seq.insert(seq.end(), item.begin(), item.end());
      if (seq.size() > kMaxGbnfElements) fail(pos_, "the grammar is too large");
    }
    return seq;
  }

  // A primary and its repetitions.
  Sequence parse_item() {
    Sequence item = parse_primary();
    for (;;) {
      const size_t at = pos_;
      const char c = peek();
      if (c == '*') {
        ++pos_;
        item = {star(item)};
      } else if (c == '+') {
        ++pos_;
        const Element once = single(item);
        item = {once, star({once})};
      } else if (c == '?') {
        ++pos_;
        item = {helper({{single(item)}, {}})};
      } else if (c == '{') {
        item = parse_braces(item, at);
      } else {
        return item;
      }
    }
  }

  // X{m}, X{m,}, X{m,n}: m copies of X, then X* or (n - m) nested optional copies.
  Sequence parse_braces(const Sequence& item, size_t at) {
    ++pos_;
    skip_space(false);
    const int m = parse_count();
    skip_space(false);
    int n = m;
    bool unbounded = false;
    if (peek() == ',') {
      ++pos_;
      skip_space(false);
      unbounded = peek() == '}';
      if (!unbounded) n = parse_count();
      skip_space(false);
    }
    if (peek() != '}') fail(pos_, "expected '}' closing a repetition");
    ++pos_;
    if (n < m)
      fail(at, fmt::format("repetition {{{},{}}}: the maximum is below the minimum", m, n));
    if (!unbounded && n == 0) return {};
    const Element once = single(item);
    Sequence out(size_t(m), once);
    if (unbounded) {
      out.push_back(star({once}));
    } else if (n > m) {
      // opt_1 ::= X | ε; opt_k ::= X opt_(k-1) | ε
      Element tail = helper({{once}, {}});
      for (int k = 2; k <= n - m; ++k) tail = helper({{once, tail}, {}});
      out.push_back(tail);
    }
    return out;
  }

  int parse_count() {
    const size_t start = pos_;
    int value = 0;
    while (peek() >= '0' && peek() <= '9') {
      value = value * 10 + (peek() - '0');
      if (value > kMaxGbnfRepeat)
        fail(start, fmt::format("repetition counts are at most {}", kMaxGbnfRepeat));
      ++pos_;
    }
    if (pos_ == start) fail(pos_, "expected a repetition count");
    return value;
  }

  Sequence parse_primary() {
    const size_t at = pos_;
    const char c = peek();
    if (c == '"') return parse_literal();
    if (c == '[') return {chars(parse_class())};
    if (c == '.') {
      ++pos_;
      return {chars({{0, kMaxCodePoint}})};
    }
    if (c == '(') {
      if (++nesting_ > kMaxGbnfNesting)
        fail(at, fmt::format("groups nest deeper than {} levels", kMaxGbnfNesting));
      ++pos_;
      Alternatives inner = parse_alternatives(/*nested=*/true);
      if (peek() != ')') fail(at, "unclosed '('");
      ++pos_;
      --nesting_;
      if (inner.size() == 1) return inner[0];
      return {helper(std::move(inner))};
    }
    const std::string_view name = name_at(pos_);
    if (!name.empty()) {
      pos_ += name.size();
      return {Element{Element::Kind::kRule, rule_index(name, at)}};
    }
    fail(at, fmt::format("unexpected '{}'", c));
  }

  Sequence parse_literal() {
    const size_t open = pos_++;
    Sequence out;
    for (;;) {
      if (at_end() || peek() == '\n') fail(open, "unterminated string literal");
      if (peek() == '"') {
        ++pos_;
        return out;
      }
      const uint32_t cp = parse_char();
      out.push_back(chars({{cp, cp}}));
    }
  }

  std::vector<Range> parse_class() {
    const size_t open = pos_++;
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    std::vector<Range> ranges;
    for (;;) {
      if (at_end()) fail(open, "unterminated character class");
      if (peek() == ']') break;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo)
          fail(open, fmt::format("character range U+{:04X}-U+{:04X} is reversed", lo, hi));
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;  // ']'
    if (ranges.empty()) fail(open, "empty character class");
    std::vector<Range> set = normalized(std::move(ranges));
    if (negated) set = complement(set);
    if (set.empty()) fail(open, "the character class matches nothing");
    return set;
  }

  // One character of a literal or class: an escape or a UTF-8 encoded code point (the text was
  // checked to be valid UTF-8 first).
  uint32_t parse_char() {
    const size_t at = pos_;
    const auto byte = static_cast<unsigned char>(text_[pos_++]);
    if (byte == '\\') {
      if (at_end()) fail(at, "an escape at the end of the grammar");
      const char e = text_[pos_++];
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '.':
        case '/':
          return uint32_t(static_cast<unsigned char>(e));
        case 'x':
          return parse_hex(2, at);
        case 'u':
          return parse_hex(4, at);
        case 'U':
          return parse_hex(8, at);
        default:
          fail(at, fmt::format("unknown escape '\\{}'", e));
      }
    }
    if (byte < 0x80) return byte;
    --pos_;
    return static_cast<uint32_t>(utf8::next(text_, pos_));  // the text is valid UTF-8
  }

  uint32_t parse_hex(int digits, size_t at) {
    uint32_t cp = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int v = -1;
      if (h >= '0' && h <= '9') v = h - '0';
      if (h >= 'a' && h <= 'f') v = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') v = h - 'A' + 10;
      if (v < 0) fail(at, fmt::format("expected {} hex digits in the escape", digits));
      cp = cp * 16 + uint32_t(v);
      ++pos_;
    }
    if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
      fail(at, fmt::format("U+{:X} is not a Unicode scalar value", cp));
    return cp;
  }

  Element chars(std::vector<Range> set) {
    const auto [it, added] = class_index_.try_emplace(set, uint32_t(classes_.size()));
    if (added) classes_.push_back(std::move(set));
    return Element{Element::Kind::kChars, it->second};
  }

  // A new rule of the current rule's text with these alternatives.
  Element helper(Alternatives alternatives) {
    const auto index = uint32_t(drafts_.size());
    drafts_.push_back(RuleDraft{fmt::format("{}#{}", current_, index), current_,
                                std::move(alternatives), true, current_at_, current_at_});
    return Element{Element::Kind::kRule, index};
  }

  // The item as one element (a helper rule when it is several, or none).
  Element single(const Sequence& item) {
    if (item.size() == 1) return item[0];
    return helper({item});
  }

  // item*: star ::= item star | ε (right recursion: the matcher's stack does not grow).
  Element star(const Sequence& item) {
    const Element once = single(item);
    const auto index = uint32_t(drafts_.size());
    const Element self{Element::Kind::kRule, index};
    drafts_.push_back(RuleDraft{fmt::format("{}#{}", current_, index),
                                current_,
                                {{once, self}, {}},
                                true,
                                current_at_,
                                current_at_});
    return self;
  }

  GbnfGrammar finish() {
    for (const RuleDraft& d : drafts_)
      if (!d.defined) fail(d.first_use, fmt::format("rule '{}' is used but not defined", d.name));
    const auto root = index_.find("root");
    if (root == index_.end()) fail(text_.size(), "the grammar has no 'root' rule");
    check_no_left_recursion();
    size_t total = 0;
    for (const RuleDraft& d : drafts_)
      for (const Sequence& seq : d.alternatives) total += seq.size() + 1;
    if (total > kMaxGbnfElements)
      fail(0, "the grammar is too large once repetitions are written out");
    GbnfGrammar g;
    g.root = root->second;
    g.classes = std::move(classes_);
    for (RuleDraft& d : drafts_) {
      std::vector<uint32_t> starts;
      for (const Sequence& seq : d.alternatives) {
        starts.push_back(uint32_t(g.elements.size()));
        g.elements.insert(g.elements.end(), seq.begin(), seq.end());
        g.elements.push_back(Element{Element::Kind::kEnd, 0});
      }
      g.rules.push_back(std::move(starts));
      g.rule_names.push_back(std::move(d.name));
    }
    return g;
  }

  // A rule that can reach itself through rules at the left edge of its alternatives (past
  // elements that can match nothing) would make the top-down matcher expand forever, and a long
  // chain of such rules would recurse as deep.
  void check_no_left_recursion() const {
    const size_t n = drafts_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Sequence& seq : drafts_[r].alternatives) {
          const bool empty = std::all_of(seq.begin(), seq.end(), [&](const Element& e) {
            return e.kind == Element::Kind::kRule && nullable[e.ref];
          });
          if (empty) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<uint32_t>> left(n);  // the rules each rule may expand first
    for (size_t r = 0; r < n; ++r)
      for (const Sequence& seq : drafts_[r].alternatives)
        for (const Element& e : seq) {
          if (e.kind != Element::Kind::kRule) break;
          left[r].push_back(e.ref);
          if (!nullable[e.ref]) break;
        }
    enum : uint8_t { kUnseen, kOpen, kDone };
    std::vector<uint8_t> mark(n, kUnseen);
    // Depth-first search, iterative; a rule met while open closes a cycle. Closing a rule gives
    // the longest chain of rules it expands into before any character (the matcher recurses
    // that deep).
    std::vector<size_t> chain(n, 1);
    for (size_t start = 0; start < n; ++start) {
      if (mark[start] != kUnseen) continue;
      std::vector<std::pair<uint32_t, size_t>> path{{uint32_t(start), 0}};
      mark[start] = kOpen;
      while (!path.empty()) {
        auto& [rule, next] = path.back();
        if (next == left[rule].size()) {
          for (uint32_t to : left[rule]) chain[rule] = std::max(chain[rule], chain[to] + 1);
          if (chain[rule] > kMaxGbnfChain)
            fail(drafts_[rule].defined_at,
                 fmt::format("rule '{}' expands more than {} rules deep before any character",
                             drafts_[rule].parent, kMaxGbnfChain));
          mark[rule] = kDone;
          path.pop_back();
          continue;
        }
        const uint32_t to = left[rule][next++];
        if (mark[to] == kOpen)
          fail(drafts_[to].defined_at,
               fmt::format("rule '{}' is left-recursive (it can reach itself before any "
                           "character, or repeats something that can be empty); write the "
                           "recursion on the right",
                           drafts_[to].parent));
        if (mark[to] == kUnseen) {
          mark[to] = kOpen;
          path.emplace_back(to, 0);
        }
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  int nesting_ = 0;      // open groups
  std::string current_;  // the rule being parsed, and where it begins
  size_t current_at_ = 0;
  std::vector<RuleDraft> drafts_;
  std::map<std::string, uint32_t, std::less<>> index_;
  std::vector<std::vector<Range>> classes_;
  std::map<std::vector<Range>, uint32_t> class_index_;
};

}  // namespace

bool GbnfGrammar::class_holds(uint32_t cls, uint32_t code_point) const {
  return class_meets(cls, code_point, code_point);
}

bool GbnfGrammar::class_meets(uint32_t cls, uint32_t lo, uint32_t hi) const {
  const std::vector<Range>& set = classes[cls];
  // The first range ending at or after lo; it meets lo..hi when it starts at or before hi.
  const auto it = std::lower_bound(set.begin(), set.end(), lo,
                                   [](const Range& r, uint32_t v) { return r.second < v; });
  return it != set.end() && it->first <= hi;
}

GbnfGrammar compile_gbnf(std::string_view text) {
  return GbnfParser(text).parse();
}

}  // namespace serval::runtime
