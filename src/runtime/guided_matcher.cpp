#include "runtime/guided_matcher.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "runtime/guided_utf8.h"

namespace serval::runtime {

namespace {

using Kind = SchemaNode::Kind;

// Where a schema leaves a value open: the shapes the matcher uses for it.
struct AnyShapes {
  SchemaNode value, object, array, string, number, booleans, null, scalars;
  SchemaNode name_key, parameters_key;  // a tool call's keys, quotes included
  AnyShapes() {
    object.kind = Kind::kObject;
    object.additional_properties = true;
    array.kind = Kind::kArray;
    string.kind = Kind::kString;
    number.kind = Kind::kNumber;
    booleans.kind = null.kind = scalars.kind = Kind::kLiterals;
    booleans.literals = {"true", "false"};
    null.literals = {"null"};
    scalars.literals = {"true", "false", "null"};
    name_key.kind = parameters_key.kind = Kind::kLiterals;
    name_key.literals = {"\"name\""};
    parameters_key.literals = {"\"parameters\""};
  }
};
const AnyShapes& any_shapes() {
  static const AnyShapes shapes;
  return shapes;
}

constexpr uint32_t kAdditionalKey = 0xffffffffu;  // kObject index: a key outside the properties

bool is_whitespace(unsigned char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}
bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}
bool is_hex(unsigned char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
uint64_t bit(size_t i) {
  return uint64_t{1} << i;
}
uint64_t low_bits(size_t n) {
  return n >= 64 ? ~uint64_t{0} : bit(n) - 1;
}

// Number states: 0 start, 1 after '-', 2 a leading 0, 3 integer digits, 4 after '.', 5 fraction
// digits, 6 after 'e', 7 after the exponent's sign, 8 exponent digits. 2, 3, 5 and 8 may end.
bool number_can_end(uint8_t state) {
  return state == 2 || state == 3 || state == 5 || state == 8;
}

// Whether some multiple of `multiple_of` of the sign whose digits begin with those of `magnitude`
// (`digits` of them; a leading 0 ends the digits) lies in lo..hi, written in at most
// kMaxNumberChars.
bool integer_prefix_fits(uint64_t magnitude, int digits, bool negative, int64_t lo, int64_t hi,
                         int64_t multiple_of) {
  using Wide = __int128;
  if (magnitude == 0) return lo <= 0 && 0 <= hi;  // "0" / "-0": nothing may follow
  // Whether [x, y] holds a multiple of k: the greatest multiple at most y is at least x.
  auto holds_multiple = [k = Wide(multiple_of)](Wide x, Wide y) {
    const Wide below = y >= 0 ? y / k * k : -((-y + k - 1) / k * k);
    return x <= y && below >= x;
  };
  Wide first = magnitude, span = 1;
  for (int length = digits + int(negative); length <= kMaxNumberChars; ++length) {
    const Wide a = negative ? -(first + span - 1) : first, b = negative ? -first : first + span - 1;
    if (holds_multiple(std::max(a, Wide(lo)), std::min(b, Wide(hi)))) return true;
    if (first > Wide(std::numeric_limits<int64_t>::max())) return false;
    first *= 10;
    span *= 10;
  }
  return false;
}

// Whether the bounds of `n` (a number) meet the values of magnitude a..b (b excluded unless
// include_end), of the sign.
bool number_range_meets(const SchemaNode& n, double a, double b, bool negative, bool include_end) {
  // The values: lo..hi, each end open or not.
  double lo = a, hi = b;
  bool lo_open = false, hi_open = !include_end;
  if (negative) {
    lo = -b;
    hi = -a;
    lo_open = !include_end;
    hi_open = false;
  }
  // Intersected with the bounds.
  if (n.number_min > lo || (n.number_min == lo && n.min_open)) {
    lo = n.number_min;
    lo_open = n.min_open;
  }
  if (n.number_max < hi || (n.number_max == hi && n.max_open)) {
    hi = n.number_max;
    hi_open = n.max_open;
  }
  return lo < hi || (lo == hi && !lo_open && !hi_open);
}

bool literal_complete(const SchemaNode& node, uint64_t mask, uint16_t pos) {
  for (size_t i = 0; i < node.literals.size(); ++i)
    if ((mask & bit(i)) && node.literals[i].size() == pos) return true;
  return false;
}

}  // namespace

JsonStack::JsonStack(const JsonGrammar& grammar, int max_whitespace_run)
    : max_whitespace_run_(max_whitespace_run) {
  Frame root = Frame::make();
  root.node = grammar.root();
  switch (grammar.output()) {
    case JsonGrammar::Output::kJson:
      root.kind = Frame::Kind::kValue;
      break;
    case JsonGrammar::Output::kChoice:
      root.kind = Frame::Kind::kLiterals;
      root.mask = low_bits(root.node->literals.size());
      break;
    case JsonGrammar::Output::kRegex:
      root.kind = Frame::Kind::kRegex;
      root.mask = RegexAutomaton::kStart;
      break;
    case JsonGrammar::Output::kGrammar:
      throw std::logic_error("a GBNF grammar is matched by GbnfMatcher, not JsonStack");
  }
  push(root);
}

JsonStack& JsonStack::operator=(const JsonStack& other) {
  std::copy_n(other.frames_.begin(), other.depth_, frames_.begin());
  depth_ = other.depth_;
  whitespace_run_ = other.whitespace_run_;
  max_whitespace_run_ = other.max_whitespace_run_;
  return *this;
}

bool JsonStack::operator==(const JsonStack& other) const {
  return depth_ == other.depth_ && whitespace_run_ == other.whitespace_run_ &&
         max_whitespace_run_ == other.max_whitespace_run_ &&
         std::equal(frames_.begin(), frames_.begin() + depth_, other.frames_.begin());
}

bool JsonStack::push(const Frame& f) {
  if (depth_ == kMaxJsonDepth) return false;
  frames_[size_t(depth_++)] = f;
  return true;
}

bool JsonStack::whitespace_ok(unsigned char c) {
  if (!is_whitespace(c) || whitespace_run_ >= max_whitespace_run_) return false;
  ++whitespace_run_;
  return true;
}

JsonStack::Fed JsonStack::feed(unsigned char c) {
  while (depth_ > 0) {
    switch (feed_top(c)) {
      case Step::kConsumed:
        if (!is_whitespace(c)) whitespace_run_ = 0;
        return Fed::kTaken;
      case Step::kConsumedPop:
        --depth_;
        whitespace_run_ = 0;
        return Fed::kTaken;
      case Step::kPopRefeed:
        --depth_;
        break;
      case Step::kRefeed:
        break;
      case Step::kFork:
        return Fed::kFork;
      case Step::kReject:
        return Fed::kRejected;
    }
  }
  return Fed::kRejected;  // the value is closed
}

bool JsonStack::can_end() const {
  if (depth_ == 0) return true;
  if (depth_ > 1) return false;
  const Frame& f = frames_[0];
  if (f.kind == Frame::Kind::kNumber) return number_complete(f);
  if (f.kind == Frame::Kind::kLiterals) return literal_complete(*f.node, f.mask, f.pos);
  if (f.kind == Frame::Kind::kRegex) return f.node->regex->can_end(f.mask);
  return false;
}

bool JsonStack::in_plain_string() const {
  if (depth_ == 0) return false;
  const Frame& f = frames_[size_t(depth_ - 1)];
  if (f.kind == Frame::Kind::kString)
    return f.state == 0 && f.pos == 0 && f.node->regex == nullptr && !f.node->has_length_limits();
  return f.kind == Frame::Kind::kKey && f.state == 0 && f.mask == 0 &&
         f.node->additional_properties;
}

JsonMatcher::JsonMatcher(const JsonGrammar& grammar, bool compact) : count_(1) {
  stacks_[0] = JsonStack(grammar, compact ? 0 : kMaxWhitespaceRun);
}

JsonMatcher& JsonMatcher::operator=(const JsonMatcher& other) {
  std::copy_n(other.stacks_.begin(), other.count_, stacks_.begin());
  count_ = other.count_;
  return *this;
}

// Feeds `c` to `stack` and keeps what comes of it in `out`: the stack, or at a fork one copy per
// alternative that can begin with `c` (each fed in turn, so nested forks split further).
void JsonMatcher::take(JsonStack& stack, unsigned char c,
                       std::array<JsonStack, kMaxJsonBranches>& out, int& count) const {
  switch (stack.feed(c)) {
    case JsonStack::Fed::kRejected:
      return;
    case JsonStack::Fed::kTaken:
      if (count < kMaxJsonBranches &&
          std::find(out.begin(), out.begin() + count, stack) == out.begin() + count)
        out[size_t(count++)] = stack;
      return;
    case JsonStack::Fed::kFork:
      for (const SchemaNode* alt : stack.fork_node().alternatives) {
        if (!value_can_begin(*alt, c)) continue;
        JsonStack branch = stack;
        branch.resolve_fork(alt);
        take(branch, c, out, count);
      }
      return;
  }
}

bool JsonMatcher::operator==(const JsonMatcher& other) const {
  return count_ == other.count_ &&
         std::equal(stacks_.begin(), stacks_.begin() + count_, other.stacks_.begin());
}

bool JsonMatcher::feed(unsigned char c) {
  std::array<JsonStack, kMaxJsonBranches> next;
  int count = 0;
  for (int i = 0; i < count_; ++i) take(stacks_[size_t(i)], c, next, count);
  std::copy_n(next.begin(), count, stacks_.begin());
  count_ = count;
  return count > 0;
}

bool JsonMatcher::feed(std::string_view bytes) {
  for (unsigned char c : bytes)
    if (!feed(c)) return false;
  return true;
}

bool JsonMatcher::done() const {
  return std::all_of(stacks_.begin(), stacks_.begin() + count_,
                     [](const JsonStack& s) { return s.done(); });
}

bool JsonMatcher::can_end() const {
  return std::any_of(stacks_.begin(), stacks_.begin() + count_,
                     [](const JsonStack& s) { return s.can_end(); });
}

bool JsonMatcher::in_plain_string() const {
  return count_ > 0 && std::all_of(stacks_.begin(), stacks_.begin() + count_,
                                   [](const JsonStack& s) { return s.in_plain_string(); });
}

JsonStack::Step JsonStack::feed_top(unsigned char c) {
  Frame& f = frames_[size_t(depth_ - 1)];
  switch (f.kind) {
    case Frame::Kind::kValue:
      return value(f, c);
    case Frame::Kind::kObject:
      return object(f, c);
    case Frame::Kind::kArray:
      return array(f, c);
    case Frame::Kind::kString:
      return string(f, c);
    case Frame::Kind::kKey:
      return key(f, c);
    case Frame::Kind::kNumber:
      return number(f, c);
    case Frame::Kind::kLiterals:
      return literals(f, c);
    case Frame::Kind::kToolCall:
      return tool_call(f, c);
    case Frame::Kind::kRegex:
      return regex(f, c);
  }
  return Step::kReject;
}

// A value about to begin: whitespace, or the first byte, which picks the frame that replaces
// this one (an anyOf alternative by that byte).
JsonStack::Step JsonStack::value(Frame& f, unsigned char c) {
  if (is_whitespace(c)) return whitespace_ok(c) ? Step::kConsumed : Step::kReject;
  const SchemaNode* n = f.node;
  while (n->kind == Kind::kAnyOf) {
    const auto fits = [c](const SchemaNode* a) { return value_can_begin(*a, c); };
    const auto count = std::count_if(n->alternatives.begin(), n->alternatives.end(), fits);
    if (count == 0) return Step::kReject;
    if (count > 1) {  // JsonMatcher tries each
      f.node = n;
      return Step::kFork;
    }
    n = *std::find_if(n->alternatives.begin(), n->alternatives.end(), fits);
  }
  const AnyShapes& any = any_shapes();
  if (n->kind == Kind::kAny) {
    n = c == '{'                           ? &any.object
        : c == '['                         ? &any.array
        : c == '"'                         ? &any.string
        : c == '-' || is_digit(c)          ? &any.number
        : c == 't' || c == 'f' || c == 'n' ? &any.scalars
                                           : nullptr;
    if (!n) return Step::kReject;
  }
  if (n->kind == Kind::kBoolean) n = &any.booleans;
  if (n->kind == Kind::kNull) n = &any.null;
  Frame next = Frame::make();
  next.node = n;
  // Objects, arrays, tool calls and strings open with a byte of their own, which they consume;
  // numbers and literals match from their first byte on.
  struct Opening {
    Kind kind;
    unsigned char byte;
    Frame::Kind frame;
  };
  static constexpr Opening kOpenings[] = {{Kind::kObject, '{', Frame::Kind::kObject},
                                          {Kind::kArray, '[', Frame::Kind::kArray},
                                          {Kind::kToolCall, '{', Frame::Kind::kToolCall},
                                          {Kind::kString, '"', Frame::Kind::kString}};
  for (const Opening& o : kOpenings) {
    if (n->kind != o.kind) continue;
    if (c != o.byte) return Step::kReject;
    next.kind = o.frame;
    if (n->regex) next.mask = RegexAutomaton::kStart;  // a string's pattern
    f = next;
    return Step::kConsumed;
  }
  if (n->kind == Kind::kNumber || n->kind == Kind::kInteger) {
    next.kind = Frame::Kind::kNumber;
  } else if (n->kind == Kind::kLiterals) {
    next.kind = Frame::Kind::kLiterals;
    next.mask = low_bits(n->literals.size());
  } else {
    return Step::kReject;
  }
  f = next;
  return Step::kRefeed;
}

bool JsonStack::required_seen(const Frame& object) const {
  const auto& props = object.node->properties;
  for (size_t i = 0; i < props.size(); ++i)
    if (props[i].required && !(object.mask & bit(i))) return false;
  return true;
}

bool JsonStack::more_keys_possible(const Frame& object) const {
  return object.node->additional_properties ||
         object.mask != low_bits(object.node->properties.size());
}

// States: 0 after '{', 1 after a key, 2 after a value, 3 after ','.
JsonStack::Step JsonStack::object(Frame& f, unsigned char c) {
  if (is_whitespace(c)) return whitespace_ok(c) ? Step::kConsumed : Step::kReject;
  auto start_key = [&] {
    Frame k = Frame::make();
    k.kind = Frame::Kind::kKey;
    k.node = f.node;
    k.mask = low_bits(f.node->properties.size()) & ~f.mask;
    f.state = 1;
    return push(k) ? Step::kConsumed : Step::kReject;
  };
  switch (f.state) {
    case 0:
      if (c == '}') return required_seen(f) ? Step::kConsumedPop : Step::kReject;
      if (c == '"' && more_keys_possible(f)) return start_key();
      return Step::kReject;
    case 1: {
      if (c != ':') return Step::kReject;
      Frame v = Frame::make();
      v.kind = Frame::Kind::kValue;
      v.node = f.index != kAdditionalKey   ? f.node->properties[f.index].value
               : f.node->additional_values ? f.node->additional_values
                                           : &any_shapes().value;
      f.state = 2;
      return push(v) ? Step::kConsumed : Step::kReject;
    }
    case 2:
      if (c == ',' && more_keys_possible(f)) {
        f.state = 3;
        return Step::kConsumed;
      }
      if (c == '}' && required_seen(f)) return Step::kConsumedPop;
      return Step::kReject;
    default:
      return c == '"' ? start_key() : Step::kReject;
  }
}

// States: 0 after '[', 1 after an item, 2 after ','. index counts the items begun.
JsonStack::Step JsonStack::array(Frame& f, unsigned char c) {
  if (is_whitespace(c)) return whitespace_ok(c) ? Step::kConsumed : Step::kReject;
  const SchemaNode& node = *f.node;
  const SchemaNode* items = f.index < node.prefix_items.size() ? node.prefix_items[f.index]
                            : node.items                       ? node.items
                                                               : &any_shapes().value;
  if (f.state == 0 && c == ']') return node.min_items == 0 ? Step::kConsumedPop : Step::kReject;
  if (f.state == 1) {
    if (c == ',' && (node.max_items < 0 || f.index < node.max_items)) {
      f.state = 2;
      return Step::kConsumed;
    }
    if (c == ']' && f.index >= node.min_items) return Step::kConsumedPop;
    return Step::kReject;
  }
  if (node.max_items >= 0 && f.index >= node.max_items) return Step::kReject;
  if (!value_can_begin(*items, c)) return Step::kReject;
  ++f.index;
  f.state = 1;
  Frame v = Frame::make();
  v.kind = Frame::Kind::kValue;
  v.node = items;
  return push(v) ? Step::kRefeed : Step::kReject;
}

// String states: 0 text, 1 after '\', 2..5 the \u escape's hex digits.
namespace {
bool escape_step(uint8_t& state, unsigned char c) {
  if (state == 1) {
    if (c == 'u') {
      state = 2;
      return true;
    }
    state = 0;
    return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
           c == 't';
  }
  if (!is_hex(c)) return false;
  state = state == 5 ? 0 : state + 1;
  return true;
}

// UTF-8 inside a string: pos holds the continuation bytes still due and, while the second is
// due, the lead byte (<< 8), whose second-byte range may be narrower.
bool utf8_step(uint16_t& pos, unsigned char c) {
  const int due = pos & 0xFF;
  if (due == 0) {
    const int more = utf8_continuations(c);
    if (more < 0) return false;
    pos = more == 0 ? 0 : uint16_t(c << 8 | more);
    return true;
  }
  const auto [lo, hi] = utf8_second_byte_range(static_cast<unsigned char>(pos >> 8));
  if (c < lo || c > hi) return false;
  pos = uint16_t(due - 1);
  return true;
}
}  // namespace

// A string value: well-formed UTF-8 (pos: the character in progress), escapes checked (state).
// With minLength / maxLength, index counts its characters, each at its first byte (an escape at
// its backslash); without, it stays 0, so the state recurs from character to character.
JsonStack::Step JsonStack::string(Frame& f, unsigned char c) {
  const SchemaNode& n = *f.node;
  const RegexAutomaton* re = n.regex;  // a pattern: its state in mask, no escapes
  auto take = [&]() {
    if (re) {
      const uint64_t next = re->step(f.mask, c);
      if (next == 0) return Step::kReject;
      f.mask = next;
    }
    return Step::kConsumed;
  };
  if (f.pos != 0) return utf8_step(f.pos, c) ? take() : Step::kReject;
  if (f.state != 0) return escape_step(f.state, c) ? Step::kConsumed : Step::kReject;
  if (c == '"') {
    const bool complete = int64_t(f.index) >= n.min_length && (!re || re->can_end(f.mask));
    return complete ? Step::kConsumedPop : Step::kReject;
  }
  if (c < 0x20 || (c == '\\' && re) || !utf8_step(f.pos, c)) return Step::kReject;
  if (n.has_length_limits()) {
    ++f.index;
    if (n.max_length >= 0 && int64_t(f.index) > n.max_length) return Step::kReject;
  }
  if (c == '\\') {
    f.state = 1;
    return Step::kConsumed;
  }
  return take();
}

// An object key: the candidates still alive among the unseen properties; on the closing quote
// the parent object learns which property (or an additional key) it was.
JsonStack::Step JsonStack::key(Frame& f, unsigned char c) {
  const SchemaNode& obj = *f.node;
  const bool other = obj.additional_properties;
  if (f.state != 0) return escape_step(f.state, c) ? Step::kConsumed : Step::kReject;
  if (c == '"') {
    Frame& parent = frames_[size_t(depth_ - 2)];
    for (size_t i = 0; i < obj.properties.size(); ++i)
      if ((f.mask & bit(i)) && obj.properties[i].name.size() == f.pos) {
        parent.mask |= bit(i);
        parent.index = uint32_t(i);
        return Step::kConsumedPop;
      }
    if (!other) return Step::kReject;
    parent.index = kAdditionalKey;
    return Step::kConsumedPop;
  }
  if (c == '\\') {
    if (!other) return Step::kReject;
    f.mask = 0;  // property names hold no escapes
    f.state = 1;
    return Step::kConsumed;
  }
  if (c < 0x20) return Step::kReject;
  uint64_t alive = 0;
  for (size_t i = 0; i < obj.properties.size(); ++i) {
    const std::string& name = obj.properties[i].name;
    if ((f.mask & bit(i)) && f.pos < name.size() && static_cast<unsigned char>(name[f.pos]) == c)
      alive |= bit(i);
  }
  if (alive == 0 && !other) return Step::kReject;
  f.mask = alive;
  if (f.pos < UINT16_MAX) ++f.pos;
  return Step::kConsumed;
}

bool JsonStack::number_complete(const Frame& f) {
  const SchemaNode& n = *f.node;
  if (!number_can_end(f.state)) return false;
  if (!n.bounded) return true;
  const bool negative = f.index & 1;
  if (n.kind == Kind::kInteger) {
    const __int128 value = negative ? -__int128(f.mask) : __int128(f.mask);
    return n.minimum <= value && value <= n.maximum && value % n.multiple_of == 0;
  }
  const double magnitude = std::bit_cast<double>(f.mask);
  return number_range_meets(n, magnitude, magnitude, negative, /*include_end=*/true);
}

bool JsonStack::integer_digit_fits(Frame& f, uint64_t digit) {
  constexpr uint64_t kMaxBefore = uint64_t(std::numeric_limits<int64_t>::max()) / 10;
  if (f.mask > kMaxBefore) return false;  // past every 64-bit bound
  const uint64_t magnitude = f.mask * 10 + digit;
  const bool negative = f.index & 1;
  const int digits = int(f.pos) - int(negative) + 1;
  if (!integer_prefix_fits(magnitude, digits, negative, f.node->minimum, f.node->maximum,
                           f.node->multiple_of))
    return false;
  f.mask = magnitude;
  return true;
}

// A bounded non-integer number's next digit or '.' (going to `state`). Its completions' values
// span [a, b) in magnitude: before the dot [v·10^j, (v+1)·10^j) for each count j of digits still
// to come ([0, 1) after a leading 0), after it [w, w + 10^-k) with k fraction digits.
bool JsonStack::number_digit_fits(Frame& f, unsigned char c, uint8_t state) {
  const SchemaNode& n = *f.node;
  const bool negative = f.index & 1;
  double magnitude = std::bit_cast<double>(f.mask);
  if (c == '.') return number_range_meets(n, magnitude, magnitude + 1, negative, false);
  const int digit = c - '0';
  if (state == 5) {
    const uint32_t fraction = (f.index >> 8) + 1;
    const double unit = std::pow(10.0, -double(fraction));
    magnitude += digit * unit;
    f.index = (f.index & 1) | fraction << 8;
    f.mask = std::bit_cast<uint64_t>(magnitude);
    return number_range_meets(n, magnitude, magnitude + unit, negative, false);
  }
  magnitude = magnitude * 10 + digit;
  f.mask = std::bit_cast<uint64_t>(magnitude);
  if (state == 2) return number_range_meets(n, 0, 1, negative, false);
  double a = magnitude, b = magnitude + 1;
  for (int length = int(f.pos) + 1; length <= kMaxNumberChars; ++length, a *= 10, b *= 10)
    if (number_range_meets(n, a, b, negative, false)) return true;
  return false;
}

// A number. A bounded one is written without an exponent, and every prefix must still have a
// completion within the bounds: a bounded integer's mask holds its magnitude (exact, 64-bit), a
// bounded number's the magnitude as a double (index >> 8: its fraction digits); index bit 0: a
// minus sign.
JsonStack::Step JsonStack::number(Frame& f, unsigned char c) {
  const SchemaNode& n = *f.node;
  const bool integer = n.kind == Kind::kInteger;
  const bool digit = is_digit(c), exp = (c == 'e' || c == 'E') && !integer,
             dot = c == '.' && !integer;
  auto fits = [&](uint8_t state) {
    if (c == '-') {
      f.index |= 1;  // -0 and below
      return integer
                 ? n.minimum <= 0
                 : number_range_meets(n, 0, std::numeric_limits<double>::infinity(), true, false);
    }
    if (state >= 6) return false;
    return integer ? integer_digit_fits(f, uint64_t(c - '0')) : number_digit_fits(f, c, state);
  };
  auto to = [&](uint8_t state) {
    if (f.pos >= kMaxNumberChars) return Step::kReject;
    if (n.bounded && !fits(state)) return Step::kReject;
    f.state = state;
    ++f.pos;
    return Step::kConsumed;
  };
  const Step end = number_complete(f) ? Step::kPopRefeed : Step::kReject;
  switch (f.state) {
    case 0:
      if (c == '-') return to(1);
      [[fallthrough]];
    case 1:
      return c == '0' ? to(2) : digit ? to(3) : Step::kReject;
    case 2:
      return dot ? to(4) : exp ? to(6) : end;
    case 3:
      return digit ? to(3) : dot ? to(4) : exp ? to(6) : end;
    case 4:
      return digit ? to(5) : Step::kReject;
    case 5:
      return digit ? to(5) : exp ? to(6) : end;
    case 6:
      return c == '+' || c == '-' ? to(7) : digit ? to(8) : Step::kReject;
    case 7:
      return digit ? to(8) : Step::kReject;
    default:
      return digit ? to(8) : end;
  }
}

JsonStack::Step JsonStack::literals(Frame& f, unsigned char c) {
  const std::vector<std::string>& lits = f.node->literals;
  uint64_t next = 0;
  bool longer = false;
  for (size_t i = 0; i < lits.size(); ++i) {
    if (!(f.mask & bit(i)) || lits[i].size() <= f.pos) continue;
    if (static_cast<unsigned char>(lits[i][f.pos]) != c) continue;
    next |= bit(i);
    longer = longer || lits[i].size() > size_t(f.pos) + 1;
  }
  if (next == 0) {
    if (!literal_complete(*f.node, f.mask, f.pos) || !report_literal(f)) return Step::kReject;
    return Step::kPopRefeed;
  }
  f.mask = next;
  ++f.pos;
  if (longer) return Step::kConsumed;
  return report_literal(f) ? Step::kConsumedPop : Step::kReject;
}

bool JsonStack::report_literal(const Frame& f) {
  if (depth_ < 2) return true;
  Frame& parent = frames_[size_t(depth_ - 2)];
  const bool tool = parent.kind == Frame::Kind::kToolCall && f.node == parent.node->tool_names;
  const bool unique = parent.kind == Frame::Kind::kArray && parent.node->unique_items;
  if (!tool && !unique) return true;
  for (size_t i = 0; i < f.node->literals.size(); ++i) {
    if (!(f.mask & bit(i)) || f.node->literals[i].size() != f.pos) continue;
    if (tool) parent.index = uint32_t(i);
    if (unique) {
      if (parent.mask & bit(i)) return false;  // this value is in the array already
      parent.mask |= bit(i);
    }
  }
  return true;
}

// {"name": N, "parameters": P}, keys in that order. States: 0 after '{', 1 after "name",
// 2 after N, 3 after ',', 4 after "parameters", 5 after P.
JsonStack::Step JsonStack::tool_call(Frame& f, unsigned char c) {
  if (is_whitespace(c)) return whitespace_ok(c) ? Step::kConsumed : Step::kReject;
  const AnyShapes& any = any_shapes();
  auto push_literal = [&](const SchemaNode& node, uint8_t next_state, Step step) {
    Frame lit = Frame::make();
    lit.kind = Frame::Kind::kLiterals;
    lit.node = &node;
    lit.mask = low_bits(node.literals.size());
    f.state = next_state;
    return push(lit) ? step : Step::kReject;
  };
  auto push_value = [&](const SchemaNode& node, uint8_t next_state) {
    Frame v = Frame::make();
    v.kind = Frame::Kind::kValue;
    v.node = &node;
    f.state = next_state;
    return push(v) ? Step::kConsumed : Step::kReject;
  };
  switch (f.state) {
    case 0:
      return push_literal(any.name_key, 1, Step::kRefeed);
    case 1:
      return c == ':' ? push_value(*f.node->tool_names, 2) : Step::kReject;
    case 2:
      if (c != ',') return Step::kReject;
      f.state = 3;
      return Step::kConsumed;
    case 3:
      return push_literal(any.parameters_key, 4, Step::kRefeed);
    case 4:
      return c == ':' ? push_value(*f.node->alternatives[f.index], 5) : Step::kReject;
    default:
      return c == '}' ? Step::kConsumedPop : Step::kReject;
  }
}

// guided_regex: the automaton's state set; the frame closes when no byte can follow.
JsonStack::Step JsonStack::regex(Frame& f, unsigned char c) {
  const RegexAutomaton& a = *f.node->regex;
  const uint64_t next = a.step(f.mask, c);
  if (next == 0) return Step::kReject;
  f.mask = next;
  return a.can_continue(next) ? Step::kConsumed : Step::kConsumedPop;
}

}  // namespace serval::runtime
