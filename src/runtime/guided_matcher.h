// Byte-level matcher of one JSON value against a compiled schema (guided_schema.h): feeds the
// output's bytes one at a time and says which may come next. A pushdown automaton with a fixed
// frame array, so copying one (to try a token's bytes) costs a few hundred bytes, no allocation.
//
// Whitespace between tokens is allowed up to kMaxWhitespaceRun bytes in a row (a pretty-printed
// value fits; a model cannot spin on blanks forever). Numbers are at most kMaxNumberChars long.
// Strings take any bytes but '"', '\' (escapes are checked) and control characters; object keys
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

class JsonMatcher {
 public:
  // `grammar` must outlive the matcher.
  explicit JsonMatcher(const JsonGrammar& grammar);
  JsonMatcher(const JsonMatcher& other) { *this = other; }
  JsonMatcher& operator=(const JsonMatcher& other);

  // Consumes `c`; false (and the matcher left in an unspecified state) when the JSON cannot
  // continue with it: copy the matcher first to try.
  bool feed(unsigned char c);
  bool feed(std::string_view bytes);

  // The value is closed: nothing may follow.
  bool done() const { return depth_ == 0; }
  // The text so far may end here (closed, or a top-level number or literal that is complete).
  bool can_end() const;
  // Inside a string where every byte but '"', '\' and control characters leaves the state as it
  // is (token masks skip over such bytes without copying).
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
      kToolCall
    };
    Kind kind = Kind::kValue;
    uint8_t state = 0;
    uint16_t pos = 0;  // kKey / kLiterals: bytes matched; kNumber: length
    // kObject: property whose value comes next; kArray: items so far; kToolCall: the tool named
    uint32_t index = 0;
    uint64_t mask = 0;  // kObject: properties seen; kKey / kLiterals: candidates alive
    const SchemaNode* node = nullptr;
  };
  // What a frame did with a byte: consumed it (and closed), handed it back after closing (a
  // number ends at the byte after it), or passed it to a frame it pushed or became.
  enum class Step { kConsumed, kConsumedPop, kPopRefeed, kRefeed, kReject };

  Step feed_top(unsigned char c);
  Step value(Frame& f, unsigned char c);
  Step object(Frame& f, unsigned char c);
  Step array(Frame& f, unsigned char c);
  Step string(Frame& f, unsigned char c);
  Step key(Frame& f, unsigned char c);
  Step number(Frame& f, unsigned char c);
  Step literals(Frame& f, unsigned char c);
  Step tool_call(Frame& f, unsigned char c);
  // A literal frame closing: a kToolCall parent learns which tool name it was.
  void report_literal(const Frame& f);
  bool push(const Frame& f);
  bool whitespace_ok(unsigned char c);
  bool required_seen(const Frame& object) const;
  bool more_keys_possible(const Frame& object) const;

  std::array<Frame, kMaxJsonDepth> frames_;
  int depth_ = 0;
  int whitespace_run_ = 0;
};

// A request's guided output: the matcher, guiding at once, or (after_think) only after the
// output's first "</think>", whose following bytes are the JSON's first.
class GuidedOutput {
 public:
  GuidedOutput(const JsonGrammar& grammar, bool after_think)
      : json_(grammar), waiting_(after_think) {}
  // Whether the next token is masked by matcher().
  bool guiding() const { return !waiting_; }
  const JsonMatcher& matcher() const { return json_; }
  // Consumes a sampled token's text. False when guided bytes do not fit (a masked token always
  // does; the bytes after "</think>" may not, and are then left before the JSON).
  bool feed(std::string_view text);

 private:
  JsonMatcher json_;
  bool waiting_;
  std::string tail_;  // the output's last bytes while waiting (a tag split across tokens)
};

}  // namespace serval::runtime
