#include "runtime/guided_regex.h"

#include <fmt/format.h>

#include <bitset>
#include <cctype>
#include <memory>
#include <string>

#include "base/error.h"

namespace serval::runtime {

namespace {

using ByteSet = std::bitset<256>;

// The parsed expression; {n,m} is expanded into copies when it is parsed.
struct Node {
  enum class Kind { kEmpty, kClass, kConcat, kAlt, kStar, kPlus, kOpt } kind = Kind::kEmpty;
  ByteSet bytes;  // kClass
  std::vector<std::shared_ptr<const Node>> children;
};
using NodePtr = std::shared_ptr<const Node>;

NodePtr make(Node::Kind kind, std::vector<NodePtr> children = {}) {
  auto n = std::make_shared<Node>();
  n->kind = kind;
  n->children = std::move(children);
  return n;
}

// The byte of a one-byte set.
unsigned char single_byte(const ByteSet& s) {
  for (int c = 0; c < 256; ++c)
    if (s.test(size_t(c))) return static_cast<unsigned char>(c);
  return 0;
}

ByteSet range(unsigned char lo, unsigned char hi) {
  ByteSet s;
  for (int c = lo; c <= hi; ++c) s.set(size_t(c));
  return s;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  NodePtr parse() {
    if (peek('^')) ++i_;
    NodePtr n = alternation();
    if (i_ < p_.size()) fail("unbalanced ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(fmt::format("regex at offset {}: {}", i_, what));
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }
  bool at_end_anchor() const { return peek('$') && i_ + 1 == p_.size(); }

  NodePtr alternation() {
    std::vector<NodePtr> alts = {concatenation()};
    while (peek('|')) {
      ++i_;
      alts.push_back(concatenation());
    }
    return alts.size() == 1 ? alts[0] : make(Node::Kind::kAlt, std::move(alts));
  }

  NodePtr concatenation() {
    std::vector<NodePtr> parts;
    while (i_ < p_.size() && !peek('|') && !peek(')')) {
      if (at_end_anchor()) {
        ++i_;
        break;
      }
      parts.push_back(quantified(atom()));
    }
    if (parts.empty()) return make(Node::Kind::kEmpty);
    return parts.size() == 1 ? parts[0] : make(Node::Kind::kConcat, std::move(parts));
  }

  int number() {
    if (i_ >= p_.size() || !std::isdigit(static_cast<unsigned char>(p_[i_]))) fail("a number");
    int v = 0;
    while (i_ < p_.size() && std::isdigit(static_cast<unsigned char>(p_[i_]))) {
      v = v * 10 + (p_[i_++] - '0');
      if (v > RegexAutomaton::kMaxPositions) fail("a repeat count that large is not supported");
    }
    return v;
  }

  NodePtr quantified(NodePtr atom) {
    for (;;) {
      if (i_ >= p_.size()) return atom;
      const char q = p_[i_];
      int lo = 0, hi = -1;
      if (q == '*' || q == '+' || q == '?') {
        ++i_;
        atom = make(q == '*'   ? Node::Kind::kStar
                    : q == '+' ? Node::Kind::kPlus
                               : Node::Kind::kOpt,
                    {atom});
      } else if (q == '{') {
        ++i_;
        lo = number();
        hi = lo;
        if (peek(',')) {
          ++i_;
          hi = peek('}') ? -1 : number();
        }
        if (!peek('}')) fail("'}' to close the repeat");
        ++i_;
        if (hi >= 0 && hi < lo) fail("a repeat range whose maximum is below its minimum");
        std::vector<NodePtr> parts(size_t(lo), atom);
        if (hi < 0) {
          parts.push_back(make(Node::Kind::kStar, {atom}));
        } else {
          for (int k = lo; k < hi; ++k) parts.push_back(make(Node::Kind::kOpt, {atom}));
        }
        atom = parts.empty() ? make(Node::Kind::kEmpty) : make(Node::Kind::kConcat, parts);
      } else {
        return atom;
      }
      if (peek('?')) ++i_;  // lazy: the same language
    }
  }

  NodePtr byte_class(ByteSet bytes) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::kClass;
    n->bytes = bytes;
    return n;
  }

  // \d \w \s (and negations) or an escaped byte, after the backslash.
  ByteSet escape() {
    if (i_ >= p_.size()) fail("a character after '\\'");
    const char c = p_[i_++];
    const ByteSet digit = range('0', '9');
    const ByteSet word = digit | range('a', 'z') | range('A', 'Z') | range('_', '_');
    ByteSet space;
    for (char s : std::string_view(" \t\n\r\f\v")) space.set(static_cast<unsigned char>(s));
    switch (c) {
      case 'd':
        return digit;
      case 'D':
        return ~digit;
      case 'w':
        return word;
      case 'W':
        return ~word;
      case 's':
        return space;
      case 'S':
        return ~space;
      case 'n':
        return range('\n', '\n');
      case 't':
        return range('\t', '\t');
      case 'r':
        return range('\r', '\r');
      case 'f':
        return range('\f', '\f');
      case 'v':
        return range('\v', '\v');
      default:
        if (std::isalnum(static_cast<unsigned char>(c)))
          fail(fmt::format("the escape '\\{}' is not supported", c));
        return range(static_cast<unsigned char>(c), static_cast<unsigned char>(c));
    }
  }

  ByteSet bracket() {  // after '['
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++i_;
    }
    ByteSet set;
    bool first = true;
    while (i_ < p_.size() && (first || !peek(']'))) {
      first = false;
      ByteSet item;
      unsigned char lo = static_cast<unsigned char>(p_[i_]);
      if (p_[i_] == '\\') {
        ++i_;
        item = escape();
        if (item.count() != 1) {
          set |= item;
          continue;
        }
        lo = single_byte(item);
      } else {
        ++i_;
      }
      if (peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        unsigned char hi = static_cast<unsigned char>(p_[i_++]);
        if (hi == '\\') {
          const ByteSet e = escape();
          if (e.count() != 1) fail("a class as the end of a range");
          hi = single_byte(e);
        }
        if (hi < lo) fail("a range whose end is below its start");
        set |= range(lo, hi);
      } else {
        set.set(lo);
      }
    }
    if (!peek(']')) fail("']' to close the class");
    ++i_;
    return negate ? ~set : set;
  }

  NodePtr atom() {
    const char c = p_[i_];
    if (c == '(') {
      if (++depth_ > kMaxGroupDepth) fail("groups nested too deeply");
      ++i_;
      if (peek('?')) {
        ++i_;
        if (peek(':')) {
          ++i_;
        } else if (peek('P') && i_ + 1 < p_.size() && p_[i_ + 1] == '<') {
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) fail("'>' to close the group name");
          i_ = close + 1;
        } else {
          fail("only (?: ) and (?P<name> ) groups are supported");
        }
      }
      NodePtr inner = alternation();
      if (!peek(')')) fail("')' to close the group");
      ++i_;
      --depth_;
      return inner;
    }
    if (c == '[') {
      ++i_;
      return byte_class(bracket());
    }
    if (c == '\\') {
      ++i_;
      return byte_class(escape());
    }
    if (c == '.') {
      ++i_;
      ByteSet any;
      any.set();
      any.reset('\n');
      return byte_class(any);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
      fail(fmt::format("'{}' with nothing to repeat", c));
    if (c == '^' || c == '$') fail("anchors are supported at the ends only");
    ++i_;
    return byte_class(range(static_cast<unsigned char>(c), static_cast<unsigned char>(c)));
  }

  static constexpr int kMaxGroupDepth = 32;  // the parser recurses per group
  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;
};

// Glushkov's construction: every class occurrence is a position; nullable / first / last per
// node, follow per position.
struct Sets {
  bool nullable;
  uint64_t first, last;
};

class Builder {
 public:
  explicit Builder(RegexAutomaton& a) : a_(a) {}

  Sets build(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kEmpty:
        return {true, 0, 0};
      case Node::Kind::kClass: {
        if (int(a_.follow.size()) == RegexAutomaton::kMaxPositions)
          throw InvalidArgument(
              fmt::format("the regex needs more than {} positions", RegexAutomaton::kMaxPositions));
        const size_t p = a_.follow.size();
        a_.follow.push_back(0);
        for (int c = 0; c < 256; ++c)
          if (n.bytes.test(size_t(c))) a_.byte_positions[size_t(c)] |= uint64_t{1} << p;
        return {false, uint64_t{1} << p, uint64_t{1} << p};
      }
      case Node::Kind::kConcat: {
        Sets acc{true, 0, 0};
        for (const NodePtr& child : n.children) {
          const Sets s = build(*child);
          link(acc.last, s.first);
          acc.first |= acc.nullable ? s.first : 0;
          acc.last = s.nullable ? acc.last | s.last : s.last;
          acc.nullable = acc.nullable && s.nullable;
        }
        return acc;
      }
      case Node::Kind::kAlt: {
        Sets acc{false, 0, 0};
        for (const NodePtr& child : n.children) {
          const Sets s = build(*child);
          acc = {acc.nullable || s.nullable, acc.first | s.first, acc.last | s.last};
        }
        return acc;
      }
      default: {  // kStar, kPlus, kOpt
        const Sets s = build(*n.children[0]);
        if (n.kind != Node::Kind::kOpt) link(s.last, s.first);
        return {s.nullable || n.kind != Node::Kind::kPlus, s.first, s.last};
      }
    }
  }

 private:
  void link(uint64_t from, uint64_t to) {
    for (size_t p = 0; p < a_.follow.size(); ++p)
      if (from & (uint64_t{1} << p)) a_.follow[p] |= to;
  }
  RegexAutomaton& a_;
};

}  // namespace

uint64_t RegexAutomaton::reach(uint64_t state) const {
  uint64_t next = (state & kStart) ? first : 0;
  for (size_t p = 0; p < follow.size(); ++p)
    if (state & (uint64_t{1} << p)) next |= follow[p];
  return next;
}

uint64_t RegexAutomaton::step(uint64_t state, unsigned char c) const {
  return reach(state) & byte_positions[c];
}

bool RegexAutomaton::can_end(uint64_t state) const {
  return (state & last) != 0 || ((state & kStart) && nullable);
}

bool RegexAutomaton::can_continue(uint64_t state) const {
  return reach(state) != 0;
}

RegexAutomaton compile_regex(std::string_view pattern) {
  const NodePtr root = Parser(pattern).parse();
  RegexAutomaton a;
  const Sets s = Builder(a).build(*root);
  a.first = s.first;
  a.last = s.last;
  a.nullable = s.nullable;
  return a;
}

}  // namespace serval::runtime
