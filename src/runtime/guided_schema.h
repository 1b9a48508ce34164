// Guided decoding (vLLM's structured outputs): what a request's output must be, compiled into a
// graph of nodes that guided_matcher.h walks byte by byte. Mostly JSON (response_format
// json_object / json_schema, guided_json, a forced tool call's arguments); a JsonGrammar can also
// hold a raw choice among strings (guided_choice), a regex (guided_regex) or a GBNF grammar
// (guided_grammar, guided_gbnf.h).
//
// Supported JSON Schema: "type" (one name, or a list of names), "properties", "required",
// "prefixItems" (tuples; "items": false ends them), "uniqueItems" over enum / const items,
// "allOf" of one schema,
// "additionalProperties" (false when absent, as in OpenAI's strict mode and xgrammar's default;
// true allows other keys with any value, a schema other keys with values of it: Dict[str, X]),
// "items", "minItems", "maxItems", "enum", "const", "anyOf" / "oneOf" (oneOf as anyOf: a value
// fitting several alternatives is allowed), "$ref" to
// "#/$defs/…" or "#/definitions/…" (recursion allowed); on strings "pattern" (searched in the
// value as JSON Schema says, unless anchored by ^ / $; guided_regex.h's syntax; the value is
// then written without escapes), "format" date, time, date-time, uuid, ipv4, email, uri and
// hostname (as patterns), "minLength" and "maxLength"; on integers and numbers "minimum",
// "maximum", "exclusiveMinimum" and "exclusiveMaximum" (integers within 64 bits; bounded values
// have no exponent); on integers "multipleOf".
// Annotations (title, description, default, examples, $schema, $id, $comment) are ignored; any
// other keyword (other formats, uniqueItems over other items, multipleOf on numbers, …) is
// refused rather than left unchecked.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/guided_gbnf.h"
#include "runtime/guided_regex.h"

namespace serval::runtime {

struct SchemaNode;

struct SchemaProperty {
  std::string name;  // the key as it appears between the quotes (no escapes)
  const SchemaNode* value = nullptr;
  bool required = false;
};

struct SchemaNode {
  enum class Kind {
    kAny,
    kObject,
    kArray,
    kString,
    kNumber,
    kInteger,
    kBoolean,
    kNull,
    kLiterals,
    kAnyOf,
    kToolCall,
    kRegex,  // the root of a guided_regex grammar
  };
  Kind kind = Kind::kAny;
  // kObject
  std::vector<SchemaProperty> properties;         // at most kMaxProperties
  bool additional_properties = false;             // other keys allowed
  const SchemaNode* additional_values = nullptr;  // their values' schema (null: any value)
  // kArray: prefix_items[i] for item i while there are such, then items (null: any value)
  std::vector<const SchemaNode*> prefix_items;
  const SchemaNode* items = nullptr;
  int64_t min_items = 0, max_items = -1;
  bool unique_items = false;  // uniqueItems (items are then literals: enum / const)
  // kLiterals (enum, const, true/false/null): the values' JSON texts, at most kMaxLiterals
  std::vector<std::string> literals;
  // kAnyOf: the alternatives (the matcher follows each that fits, up to kMaxJsonBranches).
  // kToolCall: one function call {"name": N, "parameters": P} with the keys in that order, N one
  // of `tool_names`' literals (the names as JSON strings) and P of the `alternatives` entry of the
  // same index.
  std::vector<const SchemaNode*> alternatives;
  const SchemaNode* tool_names = nullptr;
  // kRegex: the output's; kString: its "pattern" or "format" (a string value without escapes
  // matching it)
  const RegexAutomaton* regex = nullptr;
  // kString: minLength / maxLength in characters (an escape counts as one character, so a
  // surrogate pair \uXXXX\uXXXX as two); -1: no maximum
  int64_t min_length = 0, max_length = -1;
  // kInteger / kNumber with bounds: written without an exponent, and within them
  bool bounded = false;
  // kInteger: minimum / maximum (exclusive bounds moved inward), multipleOf (1: none)
  int64_t minimum = 0, maximum = 0;
  int64_t multiple_of = 1;
  // kNumber: minimum / maximum (±infinity when absent), open for the exclusive keywords; the
  // value compared as a double, as JSON Schema validators do
  double number_min = 0, number_max = 0;
  bool min_open = false, max_open = false;
  bool has_length_limits() const { return min_length > 0 || max_length >= 0; }
};

inline constexpr int kMaxProperties = 64;
inline constexpr int kMaxLiterals = 64;

// A compiled schema: the root and the nodes it points into (owned here, stable addresses).
class JsonGrammar {
 public:
  const SchemaNode* root() const { return root_; }
  // What the output is: JSON, one of root()'s literals as raw text (guided_choice), text
  // matching root()'s regex (guided_regex), or a sentence of gbnf() (guided_grammar; root() is
  // then null).
  enum class Output { kJson, kChoice, kRegex, kGrammar };
  Output output() const { return output_; }
  const GbnfGrammar& gbnf() const { return gbnf_; }

  // Any JSON object (response_format {"type": "json_object"}).
  static std::shared_ptr<const JsonGrammar> any_object();
  // A list of 1 to max_calls (-1: any number of) calls [{"name": ..., "parameters": {...}}, ...]
  // of the given tools (name, parameters schema): tool_choice "required". Throws as from_schema.
  static std::shared_ptr<const JsonGrammar> tool_calls(
      const std::vector<std::pair<std::string, nlohmann::json>>& tools, int max_calls);
  // Throws InvalidArgument naming the JSON pointer of the offending keyword.
  static std::shared_ptr<const JsonGrammar> from_schema(const nlohmann::json& schema);
  // Exactly one of `choices` (non-empty strings, at most kMaxLiterals), as they are.
  static std::shared_ptr<const JsonGrammar> choice(const std::vector<std::string>& choices);
  // Text matching `pattern` (guided_regex.h); throws InvalidArgument.
  static std::shared_ptr<const JsonGrammar> regex(std::string_view pattern);
  // A sentence of the GBNF grammar `text` (guided_gbnf.h); throws InvalidArgument.
  static std::shared_ptr<const JsonGrammar> grammar(std::string_view text);

 private:
  friend class SchemaCompiler;
  std::deque<SchemaNode> nodes_;
  const SchemaNode* root_ = nullptr;
  Output output_ = Output::kJson;
  std::deque<RegexAutomaton> regexes_;  // Output::kRegex's, and strings' "pattern"s
  GbnfGrammar gbnf_;                    // Output::kGrammar's
};

// Whether a value of `node` can begin with `c` (after whitespace).
bool value_can_begin(const SchemaNode& node, unsigned char c);

}  // namespace serval::runtime
