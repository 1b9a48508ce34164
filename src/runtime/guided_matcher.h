// Byte-level matcher of one JSON value against a compiled schema (guided_schema.h): feeds the
// output's bytes one at a time and says which may come next.
//
// Whitespace between tokens is allowed up to kMaxWhitespaceRun bytes in a row (a pretty-printed
// value fits; a model cannot spin on blanks forever). Numbers are at most kMaxNumberChars long.
// String values are well-formed UTF-8 without '"', '\' (escapes are checked) or control
// characters (keys beyond the schema's names are not checked for UTF-8); object keys
// must be the schema's property names (each at most once), or any string where additional
// properties are allowed.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/guided_schema.h"

namespace serval::runtime {

inline constexpr int kMaxWhitespaceRun = 20;
inline constexpr int kMaxNumberChars = 32;
inline constexpr int kMaxJsonDepth = 32;

// One path through the schema: a pushdown automaton with a fixed frame array, so copying one
// (to try a token's bytes) costs a few hundred bytes and no allocation. JsonMatcher runs several
// when an anyOf's alternatives can begin alike.
class JsonStack {
 public:
  // `grammar` must outlive the stack.
  // `max_whitespace_run`: blanks allowed in a row between tokens (0: compact JSON).
  JsonStack(const JsonGrammar& grammar, int max_whitespace_run);
  JsonStack() = default;
  JsonStack(const JsonStack& other) { *this = other; }
  JsonStack& operator=(const JsonStack& other);
  bool operator==(const JsonStack& other) const;

  // What feed() did with a byte: took it, refused it, or stopped at an anyOf whose alternatives
  // can both begin with it (the byte not taken; resolve_fork on copies, then feed each again).
  enum class Fed { kTaken, kRejected, kFork };
  Fed feed(unsigned char c);
  // After kFork: the anyOf, and choosing `alternative` for it.
  const SchemaNode& fork_node() const { return *frames_[size_t(depth_ - 1)].node; }
  void resolve_fork(const SchemaNode* alternative) {
    frames_[size_t(depth_ - 1)].node = alternative;
  }

  bool done() const { return depth_ == 0; }
  bool can_end() const;
  bool in_plain_string() const;

 private:
  struct Frame {
    enum class Kind : uint8_t {
      kValue,
      kObject,
      kArray,
      kString,
      kKey,
      kNumber,
      kLiterals,
      kToolCall,
      kRegex
    };
    // No member initializers: the frame array stays uninitialized until pushed (cheap copies).
    Kind kind;
    uint8_t state;
    uint16_t pos;  // kKey / kLiterals: bytes matched; kNumber: length
    // kObject: property whose value comes next; kArray: items so far; kToolCall: the tool named;
    // kString: characters so far (under length limits); kNumber (bounded): bit 0 a minus sign,
    // >> 8 fraction digits
    uint32_t index;
    // kObject: properties seen; kKey / kLiterals: candidates alive; kRegex and kString with a
    // pattern: automaton state; kNumber (bounded): the magnitude so far (a double's bits for
    // non-integers)
    uint64_t mask;
    const SchemaNode* node;
    static Frame make() { return Frame{Kind::kValue, 0, 0, 0, 0, nullptr}; }
    bool operator==(const Frame&) const = default;
  };
  // What a frame did with a byte: consumed it (and closed), handed it back after closing (a
  // number ends at the byte after it), passed it to a frame it pushed or became, or stopped at
  // an anyOf that forks.
  enum class Step { kConsumed, kConsumedPop, kPopRefeed, kRefeed, kReject, kFork };

  Step feed_top(unsigned char c);
  Step value(Frame& f, unsigned char c);
  Step object(Frame& f, unsigned char c);
  Step array(Frame& f, unsigned char c);
  Step string(Frame& f, unsigned char c);
  Step key(Frame& f, unsigned char c);
  Step number(Frame& f, unsigned char c);
  // A number frame that may end here (within its bounds, when it has some).
  static bool number_complete(const Frame& f);
  // A bounded integer's next digit / a bounded number's next digit or '.': false when no value
  // within the bounds begins so (else the magnitude is updated).
  static bool integer_digit_fits(Frame& f, uint64_t digit);
  static bool number_digit_fits(Frame& f, unsigned char c, uint8_t state);
  Step literals(Frame& f, unsigned char c);
  Step tool_call(Frame& f, unsigned char c);
  Step regex(Frame& f, unsigned char c);
  // A literal frame closing: a kToolCall parent learns which tool name it was; a kArray parent of
  // unique items records it, false when it was there already.
  bool report_literal(const Frame& f);
  bool push(const Frame& f);
  bool whitespace_ok(unsigned char c);
  bool required_seen(const Frame& object) const;
  bool more_keys_possible(const Frame& object) const;

  std::array<Frame, kMaxJsonDepth> frames_;
  int depth_ = 0;
  int whitespace_run_ = 0;
  int max_whitespace_run_ = kMaxWhitespaceRun;
};

inline constexpr int kMaxJsonBranches = 4;

// The output matched against a grammar: the JsonStacks of every way the bytes so far fit (one,
// unless an anyOf's alternatives begin alike; at most kMaxJsonBranches, identical ones merged;
// beyond that the later alternatives are dropped, which can only narrow the outputs allowed).
class JsonMatcher {
 public:
  // `grammar` must outlive the matcher. compact: no blanks between JSON tokens (vLLM's
  // disable_any_whitespace); else up to kMaxWhitespaceRun in a row.
  explicit JsonMatcher(const JsonGrammar& grammar, bool compact = false);
  JsonMatcher(const JsonMatcher& other) { *this = other; }
  JsonMatcher& operator=(const JsonMatcher& other);
  // The same ways through the same grammar (the same bytes may follow).
  bool operator==(const JsonMatcher& other) const;

  // Consumes `c`; false (and the matcher left in an unspecified state) when the JSON cannot
  // continue with it: copy the matcher first to try.
  bool feed(unsigned char c);
  bool feed(std::string_view bytes);

  // Every way is closed: nothing may follow.
  bool done() const;
  // The text so far may end here (closed, or a top-level number or literal that is complete).
  bool can_end() const;
  // Inside a string where every whole character but '"', '\' and control characters leaves the
  // state as it is (token masks skip over such characters without copying).
  bool in_plain_string() const;

 private:
  void take(JsonStack& stack, unsigned char c, std::array<JsonStack, kMaxJsonBranches>& out,
            int& count) const;

  std::array<JsonStack, kMaxJsonBranches> stacks_;
  int count_ = 0;
};

}  // namespace serval::runtime
