// Guided decoding's JSON matcher: what it accepts under json_object and under schemas, checked
// against nlohmann::json's parser (whatever the matcher accepts and may end parses, and is an
// object for json_object), and the schema compiler's refusals.
#include "runtime/guided_matcher.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "base/error.h"
#include "runtime/engine.h"
#include "runtime/guided_output.h"
#include "support/each_string.h"

namespace serval::runtime {
namespace {

using serval::testing::each_string;

using nlohmann::json;

// Whether `text` is accepted whole and may end there.
bool accepts(const JsonGrammar& g, std::string_view text) {
  JsonMatcher m(g);
  return m.feed(text) && m.can_end();
}

std::shared_ptr<const JsonGrammar> schema(const char* text) {
  return json_schema_grammar(text);
}

TEST(GuidedMatcher, JsonObjectAcceptsObjectsOnly) {
  const auto g = json_object_grammar();
  for (const char* ok :
       {"{}", "{\"a\": 1}", "{\"a\":[1,-2.5e-3,0,\"x\",true,null,{\"b\":{}}]}",
        "{\n  \"a\": \"\\u00e9\\n\",\n  \"b\": [ ]\n}", " {\"k\":false}", "{\"\": 1E+2}"})
    EXPECT_TRUE(accepts(*g, ok)) << ok;
  for (const char* bad :
       {"[]", "1", "\"s\"", "{\"a\" 1}", "{\"a\": 01}", "{\"a\": tru}", "{\"a\": 1}x", "{\"a\":1,}",
        "{\"a\": \"x\ny\"}", "{\"a\": \"\\q\"}", "{\"a\": \"\\u12G4\"}", "{\"a\": 1.}",
        "{\"a\": -}", "{,}", "{\"a\": [1 2]}", "{\"a\": nul}"})
    EXPECT_FALSE(accepts(*g, bad)) << bad;
  JsonMatcher open(*g);
  ASSERT_TRUE(open.feed("{\"a\": [1"));
  EXPECT_FALSE(open.can_end());
  EXPECT_FALSE(open.done());
  JsonMatcher closed(*g);
  ASSERT_TRUE(closed.feed("{}"));
  EXPECT_TRUE(closed.done());
  EXPECT_FALSE(closed.feed(' '));  // nothing, not even blanks, after the value
}

TEST(GuidedMatcher, WhitespaceRunsAndNumbersAreBounded) {
  const auto g = json_object_grammar();
  EXPECT_TRUE(accepts(*g, "{" + std::string(kMaxWhitespaceRun, ' ') + "}"));
  EXPECT_FALSE(accepts(*g, "{" + std::string(kMaxWhitespaceRun + 1, ' ') + "}"));
  EXPECT_TRUE(accepts(*g, "{\"n\": " + std::string(kMaxNumberChars, '7') + "}"));
  EXPECT_FALSE(accepts(*g, "{\"n\": " + std::string(kMaxNumberChars + 1, '7') + "}"));
}

// A random JSON value (objects at the root when `object`), dumped compact or indented.
json random_value(std::mt19937& rng, int depth, bool object) {
  const int kind = object ? 0 : int(rng() % (depth > 3 ? 5u : 7u));
  auto word = [&] {
    static const char* words[] = {"a", "key", "x y", "é", "q\"uote", "back\\slash", "tab\t", ""};
    return std::string(words[rng() % 8]);
  };
  switch (kind) {
    case 0: {
      json o = json::object();
      for (unsigned i = rng() % 4; i > 0; --i) o[word()] = random_value(rng, depth + 1, false);
      return o;
    }
    case 1:
      return word();
    case 2:
      return int64_t(rng() % 2000) - 1000;
    case 3:
      return (double(rng() % 100000) - 50000) / 64.0;
    case 4:
      return rng() % 3 == 0 ? json(nullptr) : json(rng() % 2 == 0);
    default: {
      json a = json::array();
      for (unsigned i = rng() % 4; i > 0; --i) a.push_back(random_value(rng, depth + 1, false));
      return a;
    }
  }
}

// Every dump of random objects is accepted; every accepted mutation of one parses as an object.
TEST(GuidedMatcher, AgreesWithAJsonParser) {
  const auto g = json_object_grammar();
  std::mt19937 rng(7);
  int accepted_mutants = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const json v = random_value(rng, 0, true);
    const std::string text = v.dump(trial % 3 == 0 ? 2 : -1);
    ASSERT_TRUE(accepts(*g, text)) << text;
    std::string mutant = text;
    const size_t at = rng() % mutant.size();
    // ASCII bytes only: the matcher leaves UTF-8 to the detokenizer, the parser checks it.
    if (static_cast<unsigned char>(mutant[at]) >= 0x80) continue;
    // No exponent letters: a mutant like 1E1875 is JSON but out of the parser's double range.
    static const char bytes[] = "{}[],:\" \\01-.+tfnul\n";
    mutant[at] = bytes[rng() % (sizeof(bytes) - 1)];
    if (!accepts(*g, mutant)) continue;
    ++accepted_mutants;
    const json parsed = json::parse(mutant, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << mutant;
    EXPECT_TRUE(parsed.is_object()) << mutant;
  }
  EXPECT_GT(accepted_mutants, 10);  // the check above had cases
}

TEST(GuidedMatcher, SchemaPropertiesRequiredAndTypes) {
  const auto g = schema(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": "number"},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
      "ok": {"type": "boolean"}, "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
    "required": ["name", "age"]})");
  EXPECT_TRUE(accepts(*g, R"({"name": "Ann", "age": 31})"));
  EXPECT_TRUE(accepts(*g, R"({"age": -4, "name": "", "score": 1.5e3, "tags": ["a", "b"]})"));
  EXPECT_TRUE(accepts(*g, R"({"name": "A", "age": 0, "ok": true, "nick": null})"));
  EXPECT_TRUE(accepts(*g, R"({"name": "A", "age": 0, "nick": "Al"})"));
  EXPECT_FALSE(accepts(*g, R"({"name": "Ann"})"));                       // age required
  EXPECT_FALSE(accepts(*g, R"({"name": "Ann", "age": 3.5})"));           // integer
  EXPECT_FALSE(accepts(*g, R"({"name": 1, "age": 3})"));                 // string
  EXPECT_FALSE(accepts(*g, R"({"name": "A", "age": 3, "extra": 1})"));   // no additional keys
  EXPECT_FALSE(accepts(*g, R"({"name": "A", "name": "B", "age": 3})"));  // each key once
  EXPECT_FALSE(accepts(*g, R"({"name": "A", "age": 3, "tags": ["a", "b", "c"]})"));
  EXPECT_FALSE(accepts(*g, R"({"name": "A", "age": 3, "ok": null})"));
  EXPECT_FALSE(accepts(*g, R"({"nam": "A", "age": 3})"));
}

TEST(GuidedMatcher, SchemaEnumsConstRefsAndAdditional) {
  const auto g = schema(R"({"$defs": {"Node": {"type": "object", "properties": {
      "v": {"enum": ["red", "green", 1, 12, null]},
      "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}, "required": ["v"]}},
    "$ref": "#/$defs/Node"})");
  EXPECT_TRUE(accepts(*g, R"({"v": "red"})"));
  EXPECT_TRUE(accepts(*g, R"({"v": 1, "next": {"v": 12, "next": {"v": null}}})"));
  EXPECT_FALSE(accepts(*g, R"({"v": "blue"})"));
  EXPECT_FALSE(accepts(*g, R"({"v": 2})"));
  EXPECT_FALSE(accepts(*g, R"({"v": 123})"));
  EXPECT_FALSE(accepts(*g, R"({"v": "red", "next": []})"));

  const auto open = schema(R"({"type": "object", "properties": {"k": {"const": "c"}},
      "additionalProperties": true, "required": ["k"]})");
  EXPECT_TRUE(accepts(*open, R"({"k": "c", "other": [1, {"x": null}]})"));
  EXPECT_TRUE(accepts(*open, R"({"o\"ther": 1, "k": "c"})"));
  EXPECT_FALSE(accepts(*open, R"({"k": "d"})"));

  const auto list = schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1})");
  EXPECT_TRUE(accepts(*list, "[1, 2]"));
  EXPECT_FALSE(accepts(*list, "[]"));
  const auto number = schema(R"({"type": "number"})");
  JsonMatcher n(*number);
  ASSERT_TRUE(n.feed("12"));
  EXPECT_TRUE(n.can_end());  // a top-level number may end at any digit
  EXPECT_FALSE(n.done());
}

// tool_choice "required": a non-empty list of {"name", "parameters"} (keys in that order), the
// parameters following the named tool's schema.
TEST(GuidedMatcher, ToolCallLists) {
  const auto g = tool_calls_grammar(
      {{"get_weather", R"({"type": "object", "properties": {"city": {"type": "string"}},
          "required": ["city"]})"},
       {"now", "{}"}});
  for (const char* ok :
       {R"([{"name": "get_weather", "parameters": {"city": "Oslo"}}])",
        R"([{"name":"now","parameters":{}}, {"name": "get_weather", "parameters": {"city": ""}}])",
        "[\n  {\n    \"name\": \"now\",\n    \"parameters\": [1, 2]\n  }\n]"})
    EXPECT_TRUE(accepts(*g, ok)) << ok;
  for (const char* bad :
       {"[]", R"([{"parameters": {}, "name": "now"}])", R"([{"name": "nope", "parameters": {}}])",
        R"([{"name": "get_weather", "parameters": {"town": "x"}}])", R"([{"name": "now"}])",
        R"({"name": "now", "parameters": {}})"})
    EXPECT_FALSE(accepts(*g, bad)) << bad;
  const auto one = tool_calls_grammar({{"now", "{}"}}, /*max_calls=*/1);
  EXPECT_TRUE(accepts(*one, R"([{"name": "now", "parameters": 1}])"));
  EXPECT_FALSE(
      accepts(*one, R"([{"name": "now", "parameters": 1}, {"name": "now", "parameters": 2}])"));
  EXPECT_THROW(tool_calls_grammar({{"f", R"({"type": "string", "format": "ipv6"})"}}),
               InvalidArgument);
  EXPECT_THROW(tool_calls_grammar({}), InvalidArgument);
}

// "pattern" on strings: searched in the value unless anchored, the value written without escapes.
TEST(GuidedMatcher, StringPatterns) {
  const auto g = schema(R"({"type": "object", "properties": {
      "zip": {"type": "string", "pattern": "^\\d{5}$"}, "tag": {"pattern": "ab"}},
      "required": ["zip"]})");
  for (const char* ok : {R"({"zip": "12345"})", R"({"zip": "00000", "tag": "xaby"})",
                         R"({"zip": "12345", "tag": "ab"})"})
    EXPECT_TRUE(accepts(*g, ok)) << ok;
  for (const char* bad :
       {R"({"zip": "1234"})", R"({"zip": "123456"})", R"({"zip": "12a45"})",
        R"({"zip": "12345", "tag": "a b"})", R"({"zip": "12345", "tag": "a\u0062"})"})
    EXPECT_FALSE(accepts(*g, bad)) << bad;
}

// Compact JSON (disable_any_whitespace): no blanks between tokens, inside strings as usual.
TEST(GuidedMatcher, CompactJsonHasNoBlanks) {
  const auto g = schema(R"({"type": "object", "properties": {"a": {"type": "array"},
      "b": {"type": "string"}}})");
  auto compact_accepts = [&](std::string_view text) {
    JsonMatcher m(*g, /*compact=*/true);
    return m.feed(text) && m.can_end();
  };
  EXPECT_TRUE(compact_accepts(R"({"a":[1,{"x":null}],"b":"s p a c e s"})"));
  for (const char* bad : {R"({ "a":[]})", R"({"a": []})", R"({"a":[1, 2]})", "{\"a\":[]\n}"})
    EXPECT_FALSE(compact_accepts(bad)) << bad;
  EXPECT_TRUE(accepts(*g, R"({ "a": [1, 2] })"));  // blanks allowed otherwise
}

// Characters of a JSON string value as JSON Schema counts them (code points; an escape is one).
size_t code_points(const std::string& utf8) {
  size_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;
  return n;
}

// minLength / maxLength: every string of up to six pieces (ASCII, a two-byte character, escapes)
// is accepted exactly when nlohmann's parse of it has the length.
TEST(GuidedMatcher, StringLengths) {
  for (const auto& [min, max] : std::vector<std::pair<int, int>>{{2, 3}, {0, 1}, {4, -1}, {1, 1}}) {
    const std::string text =
        max < 0
            ? fmt::format(R"({{"type": "string", "minLength": {}}})", min)
            : fmt::format(R"({{"type": "string", "minLength": {}, "maxLength": {}}})", min, max);
    const auto g = schema(text.c_str());
    const std::vector<std::string> pieces = {"a", "\xc3\xa9", "\\n", "\\u00e9", " "};
    std::vector<std::string> layer = {""};
    for (int len = 0; len <= 6; ++len) {
      std::vector<std::string> next;
      for (const std::string& body : layer) {
        const std::string doc = "\"" + body + "\"";
        const size_t n = code_points(nlohmann::json::parse(doc).get<std::string>());
        const bool want = n >= size_t(min) && (max < 0 || n <= size_t(max));
        ASSERT_EQ(accepts(*g, doc), want) << text << " on " << doc;
        if (len < 6)
          for (const std::string& p : pieces) next.push_back(body + p);
      }
      layer = std::move(next);
    }
  }
  EXPECT_THROW(schema(R"({"type": "string", "minLength": 3, "maxLength": 2})"), InvalidArgument);
  EXPECT_THROW(schema(R"({"type": "string", "maxLength": -1})"), InvalidArgument);
}

// String values are well-formed UTF-8, as nlohmann's parser wants them, also under a pattern.
TEST(GuidedMatcher, StringsAreWellFormedUtf8) {
  const auto any = json_object_grammar();
  const auto patterned = schema(R"({"type": "object", "properties": {"s": {"pattern": "^.+$"}}})");
  for (const std::string body : {"\xc3\xa9", "\xf0\x9f\x98\x80", "\xe2\x82\xac", "\x80", "\xc3",
                                 "\xc3\x28", "\xed\xa0\x80", "\xc0\xaf", "\xe0\x80\xaf",
                                 "\xf4\x90\x80\x80", "\xf8\x88\x80\x80", "a\xff", "\xef\xbf\xbd"}) {
    const std::string doc = "{\"s\": \"" + body + "\"}";
    const bool valid = nlohmann::json::accept(doc);
    EXPECT_EQ(accepts(*any, doc), valid) << doc;
    EXPECT_EQ(accepts(*patterned, doc), valid) << doc;
  }
}

// Integer bounds: every text of up to five characters over "-0123456789" is accepted exactly
// when it is a JSON integer within the bounds, and taken as a prefix exactly when some integer
// within the bounds begins with it.
TEST(GuidedMatcher, IntegerBounds) {
  struct Case {
    const char* bounds;
    int64_t lo, hi;
  };
  const std::vector<Case> cases = {
      {R"("minimum": -15, "maximum": 7)", -15, 7},
      {R"("minimum": 10, "maximum": 15)", 10, 15},
      {R"("minimum": 0, "maximum": 0)", 0, 0},
      {R"("exclusiveMinimum": -4, "exclusiveMaximum": 0)", -3, -1},
      {R"("minimum": 100.5, "maximum": 250)", 101, 250},
      {R"("exclusiveMinimum": 2.5, "maximum": 1e3)", 3, 1000},
  };
  for (const Case& c : cases) {
    const std::string text = std::string(R"({"type": "integer", )") + c.bounds + "}";
    const auto g = schema(text.c_str());
    std::vector<std::string> in_range;
    for (int64_t v = c.lo; v <= c.hi; ++v) in_range.push_back(std::to_string(v));
    if (c.lo <= 0 && 0 <= c.hi) in_range.push_back("-0");
    each_string("-0123456789", 5, [&](const std::string& s) {
      const bool viable = std::any_of(in_range.begin(), in_range.end(),
                                      [&](const std::string& v) { return v.starts_with(s); });
      const bool whole = std::find(in_range.begin(), in_range.end(), s) != in_range.end();
      JsonMatcher m(*g);
      ASSERT_EQ(m.feed(s), viable) << c.bounds << " on '" << s << "'";
      if (viable) {
        ASSERT_EQ(m.can_end(), whole) << c.bounds << " on '" << s << "'";
      }
    });
  }
  const auto wide = schema(R"({"type": "integer", "minimum": -9000000000000000000,
      "maximum": 9000000000000000000})");
  EXPECT_TRUE(accepts(*wide, "-9000000000000000000"));
  EXPECT_TRUE(accepts(*wide, "8999999999999999999"));
  EXPECT_FALSE(accepts(*wide, "9000000000000000001"));
  EXPECT_FALSE(accepts(*wide, "-90000000000000000000"));
  // In an object: the closing brace waits for a value within the bounds.
  const auto obj = schema(
      R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5}}, "required": ["n"]})");
  EXPECT_TRUE(accepts(*obj, R"({"n": 5})"));
  EXPECT_FALSE(accepts(*obj, R"({"n": 4})"));
  EXPECT_FALSE(accepts(*obj, R"({"n": -1})"));
  for (const char* bad : {R"({"type": "integer", "minimum": 1e19})",
                          R"({"type": "integer", "minimum": 3, "maximum": 2})",
                          R"({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3})",
                          R"({"type": "integer", "minimum": "1"})"})
    EXPECT_THROW(schema(bad), InvalidArgument) << bad;
}

// multipleOf on integers, with and without bounds: every text of up to four characters is
// taken exactly when some multiple within the bounds begins with it, and ends exactly on one.
TEST(GuidedMatcher, IntegerMultiples) {
  struct Case {
    const char* keywords;
    int64_t lo, hi, k;
  };
  for (const Case& c :
       std::vector<Case>{{R"("multipleOf": 7, "minimum": -30, "maximum": 40)", -30, 40, 7},
                         {R"("multipleOf": 25, "exclusiveMinimum": 0, "maximum": 99)", 1, 99, 25},
                         {R"("multipleOf": 3.0, "minimum": 10, "maximum": 12)", 10, 12, 3}}) {
    const auto g = schema((std::string(R"({"type": "integer", )") + c.keywords + "}").c_str());
    std::vector<std::string> multiples;
    for (int64_t v = c.lo; v <= c.hi; ++v)
      if (v % c.k == 0) multiples.push_back(std::to_string(v));
    if (c.lo <= 0 && 0 <= c.hi) multiples.push_back("-0");
    each_string("-0123456789", 4, [&](const std::string& s) {
      const bool viable = std::any_of(multiples.begin(), multiples.end(),
                                      [&](const std::string& v) { return v.starts_with(s); });
      JsonMatcher m(*g);
      ASSERT_EQ(m.feed(s), viable) << c.keywords << " on '" << s << "'";
      if (viable) {
        ASSERT_EQ(m.can_end(), std::find(multiples.begin(), multiples.end(), s) != multiples.end())
            << c.keywords << " on '" << s << "'";
      }
    });
  }
  const auto dozens = schema(R"({"type": "integer", "multipleOf": 12})");
  for (const char* ok : {"0", "12", "-36", "1200000000000000000"})
    EXPECT_TRUE(accepts(*dozens, ok)) << ok;
  for (const char* bad : {"1", "13", "-7", "1200000000000000001"})
    EXPECT_FALSE(accepts(*dozens, bad)) << bad;
  JsonMatcher prefix(*dozens);
  EXPECT_TRUE(prefix.feed("7"));  // 72 follows
  for (const char* bad :
       {R"({"type": "integer", "multipleOf": 0.5})", R"({"type": "integer", "multipleOf": 0})",
        R"({"type": "number", "multipleOf": 0.01})", R"({"multipleOf": 2})"})
    EXPECT_THROW(schema(bad), InvalidArgument) << bad;
}

// Number bounds: every text of up to five characters over "-0123456789." is accepted exactly
// when it is a JSON number within the bounds (compared as a double), and every prefix taken can
// still be completed to one (a search of four more characters finds it).
TEST(GuidedMatcher, NumberBounds) {
  struct Case {
    const char* bounds;
    double lo, hi;
    bool lo_open, hi_open;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {R"("minimum": -2.5, "maximum": 10)", -2.5, 10, false, false},
      {R"("exclusiveMinimum": 0.1, "maximum": 0.25)", 0.1, 0.25, true, false},
      {R"("minimum": 1, "maximum": 1)", 1, 1, false, false},
      {R"("exclusiveMinimum": -1, "exclusiveMaximum": 0)", -1, 0, true, true},
      {R"("minimum": 5)", 5, inf, false, false},
      {R"("maximum": -0.5)", -inf, -0.5, false, false},
      {R"("minimum": 0, "exclusiveMaximum": 1, "maximum": 3)", 0, 1, false, true},
  };
  const std::string alphabet = "-0123456789.";
  for (const Case& c : cases) {
    const std::string text = std::string(R"({"type": "number", )") + c.bounds + "}";
    const auto g = schema(text.c_str());
    auto oracle = [&](const std::string& t) {
      if (t.empty() || !nlohmann::json::accept(t)) return false;
      const double v = std::strtod(t.c_str(), nullptr);
      return (c.lo_open ? v > c.lo : v >= c.lo) && (c.hi_open ? v < c.hi : v <= c.hi);
    };
    // Some completion of `m` within `more` characters that the matcher may end with.
    std::function<bool(const JsonMatcher&, const std::string&, int)> completes =
        [&](const JsonMatcher& m, const std::string& t, int more) {
          if (m.can_end()) return oracle(t);
          if (more == 0) return false;
          for (char ch : alphabet) {
            JsonMatcher next = m;
            if (next.feed(static_cast<unsigned char>(ch)) && completes(next, t + ch, more - 1))
              return true;
          }
          return false;
        };
    std::vector<std::string> layer = {""};
    for (int len = 0; len <= 5; ++len) {
      std::vector<std::string> next;
      for (const std::string& s : layer) {
        JsonMatcher m(*g);
        const bool taken = m.feed(s);
        if (taken) {
          ASSERT_EQ(m.can_end(), oracle(s)) << c.bounds << " on '" << s << "'";
          if (len <= 4) {
            ASSERT_TRUE(completes(m, s, 4)) << c.bounds << ": '" << s << "' leads nowhere";
          }
        } else {
          ASSERT_FALSE(oracle(s)) << c.bounds << " refused '" << s << "'";
        }
        if (len < 5 && taken)
          for (char ch : alphabet) next.push_back(s + ch);
      }
      layer = std::move(next);
    }
    EXPECT_FALSE(accepts(*g, "1e0")) << "no exponent under bounds";
  }
  for (const char* bad : {R"({"type": "number", "minimum": 2, "maximum": 1})",
                          R"({"type": "number", "minimum": 1, "exclusiveMaximum": 1})",
                          R"({"type": "number", "maximum": "1"})"})
    EXPECT_THROW(schema(bad), InvalidArgument) << bad;
  EXPECT_TRUE(accepts(*schema(R"({"type": "number"})"), "1e5"));  // unbounded: as before
}

// Tuples (Pydantic's Tuple[int, str]): prefixItems in order, then items (or none after
// "items": false); allOf of one schema is that schema; reference cycles without a value are
// refused.
TEST(GuidedMatcher, TuplesAllOfAndReferenceCycles) {
  const auto pair = schema(R"({"type": "array", "prefixItems": [{"type": "integer"},
      {"type": "string"}], "items": false, "minItems": 2})");
  for (const char* ok : {R"([1, "a"])", R"([ -3 ,"" ])"}) EXPECT_TRUE(accepts(*pair, ok)) << ok;
  for (const char* bad : {R"([1])", R"(["a", 1])", R"([1, "a", 2])", R"([])"})
    EXPECT_FALSE(accepts(*pair, bad)) << bad;
  const auto head = schema(R"({"prefixItems": [{"const": "x"}], "items": {"type": "null"}})");
  for (const char* ok : {R"([])", R"(["x"])", R"(["x", null, null])"})
    EXPECT_TRUE(accepts(*head, ok)) << ok;
  for (const char* bad : {R"([null])", R"(["x", "x"])"}) EXPECT_FALSE(accepts(*head, bad)) << bad;

  const auto wrapped = schema(R"({"$defs": {"Pet": {"type": "object", "properties":
      {"name": {"type": "string"}}, "required": ["name"]}}, "type": "object", "properties":
      {"pet": {"allOf": [{"$ref": "#/$defs/Pet"}], "description": "the pet"}}, "required": ["pet"]})");
  EXPECT_TRUE(accepts(*wrapped, R"({"pet": {"name": "Rex"}})"));
  EXPECT_FALSE(accepts(*wrapped, R"({"pet": {}})"));
  for (const char* bad :
       {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})",
        R"({"allOf": [{"type": "string"}], "maxLength": 3})",
        R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"allOf": [{"$ref": "#/$defs/A"}]}},
            "$ref": "#/$defs/A"})",
        R"({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"})"})
    EXPECT_THROW(schema(bad), InvalidArgument) << bad;
  // A recursive definition through a value is fine.
  const auto tree = schema(R"({"$defs": {"T": {"type": "array", "items": {"$ref": "#/$defs/T"}}},
      "$ref": "#/$defs/T"})");
  EXPECT_TRUE(accepts(*tree, "[[], [[]]]"));
}

// additionalProperties as a schema (Pydantic's Dict[str, X]): any other key, its value of the
// schema; named properties keep theirs.
TEST(GuidedMatcher, AdditionalPropertiesSchema) {
  const auto scores = schema(R"({"type": "object", "additionalProperties": {"type": "integer",
      "minimum": 0}, "properties": {"name": {"type": "string"}}})");
  for (const char* ok : {R"({})", R"({"a": 1, "b": 20})", R"({"name": "x", "z": 0})"})
    EXPECT_TRUE(accepts(*scores, ok)) << ok;
  for (const char* bad : {R"({"a": -1})", R"({"a": "1"})", R"({"name": 3})", R"({"a": 1.5})"})
    EXPECT_FALSE(accepts(*scores, bad)) << bad;
  EXPECT_THROW(schema(R"({"type": "object", "additionalProperties": 3})"), InvalidArgument);
}

// A schema as Pydantic v2 writes one for a model using the common field types compiles, and
// its instances are told apart from near misses.
TEST(GuidedMatcher, PydanticModelSchema) {
  const auto user = schema(R"({"$defs": {
      "Address": {"properties": {"street": {"title": "Street", "type": "string"},
          "zip": {"pattern": "^\\d{5}$", "title": "Zip", "type": "string"}},
        "required": ["street", "zip"], "title": "Address", "type": "object"},
      "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"}},
    "properties": {
      "name": {"maxLength": 20, "minLength": 1, "title": "Name", "type": "string"},
      "age": {"exclusiveMinimum": 0, "title": "Age", "type": "integer"},
      "email": {"format": "email", "title": "Email", "type": "string"},
      "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
      "address": {"$ref": "#/$defs/Address"},
      "color": {"$ref": "#/$defs/Color", "default": "red"},
      "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
      "scores": {"additionalProperties": {"type": "number"}, "title": "Scores", "type": "object"},
      "pair": {"maxItems": 2, "minItems": 2, "prefixItems": [{"type": "integer"},
          {"type": "string"}], "type": "array"},
      "created": {"format": "date-time", "type": "string"},
      "ratio": {"maximum": 1.0, "minimum": 0.0, "type": "number"}},
    "required": ["name", "age", "email", "tags", "address", "pair", "created", "ratio"],
    "title": "User", "type": "object"})");
  const std::string ok = R"({"name": "Ann", "age": 31, "email": "ann@example.org", "tags": [],
      "address": {"street": "Main 1", "zip": "12345"}, "color": "green", "nickname": null,
      "scores": {"math": 0.5}, "pair": [1, "a"], "created": "2026-12-07T10:00:00Z",
      "ratio": 0.25})";
  EXPECT_TRUE(accepts(*user, ok));
  const std::vector<std::pair<std::string, std::string>> misses = {
      {R"("age": 31)", R"("age": 0)"},           {R"("ann@example.org")", R"("ann-example.org")"},
      {R"("zip": "12345")", R"("zip": "1234")"}, {R"("green")", R"("blue")"},
      {R"([1, "a"])", R"([1, "a", 2])"},         {R"("ratio": 0.25)", R"("ratio": 1.25)"},
      {R"("name": "Ann")", R"("name": "")"},     {R"({"math": 0.5})", R"({"math": "x"})"},
  };
  for (const auto& [from, to] : misses) {
    std::string bad = ok;
    bad.replace(bad.find(from), from.size(), to);
    EXPECT_FALSE(accepts(*user, bad)) << to;
  }
}

// uniqueItems over enum items (Pydantic's set[Color]): a value already in the array is refused
// at the byte that would complete it, so "1" may still grow into "12".
TEST(GuidedMatcher, UniqueLiteralItems) {
  const auto colors = schema(R"({"type": "array", "uniqueItems": true,
      "items": {"enum": ["red", "green", 1, 12]}})");
  for (const char* ok : {"[]", R"(["red", "green"])", R"([1, 12, "red"])", R"([12,1])"})
    EXPECT_TRUE(accepts(*colors, ok)) << ok;
  for (const char* bad : {R"(["red", "red"])", R"([1, 1])", R"([12, "green", 12])"})
    EXPECT_FALSE(accepts(*colors, bad)) << bad;
  JsonMatcher m(*colors);
  ASSERT_TRUE(m.feed(R"([1, 1)"));  // "1" again may still become 12
  EXPECT_FALSE(JsonMatcher(m).feed("]"));
  EXPECT_TRUE(m.feed("2]"));
  const auto refs = schema(R"({"$defs": {"C": {"enum": ["a", "b"]}}, "type": "array",
      "uniqueItems": true, "items": {"$ref": "#/$defs/C"}})");
  EXPECT_TRUE(accepts(*refs, R"(["b", "a"])"));
  EXPECT_FALSE(accepts(*refs, R"(["a", "a"])"));
  EXPECT_TRUE(accepts(*schema(R"({"type": "array", "uniqueItems": false})"), "[1, 1]"));
  for (const char* bad : {R"({"type": "array", "uniqueItems": true, "items": {"type": "string"}})",
                          R"({"type": "array", "uniqueItems": true})",
                          R"({"type": "array", "uniqueItems": "yes", "items": {"enum": [1]}})"})
    EXPECT_THROW(schema(bad), InvalidArgument) << bad;
}

// Pydantic's discriminated unions: oneOf with an OpenAPI discriminator (an annotation here; the
// alternatives' const tags do the telling apart).
TEST(GuidedMatcher, DiscriminatedUnions) {
  const auto pets = schema(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
       "required": ["kind", "lives"]},
      {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
       "required": ["kind", "good"]}],
      "discriminator": {"propertyName": "kind", "mapping": {"cat": "#/$defs/Cat"}}})");
  EXPECT_TRUE(accepts(*pets, R"({"kind": "cat", "lives": 9})"));
  EXPECT_TRUE(accepts(*pets, R"({"kind": "dog", "good": true})"));
  EXPECT_FALSE(accepts(*pets, R"({"kind": "cat", "good": true})"));
}

// Formats as patterns: shapes accepted and refused; unknown formats and a pattern with a format
// are refused.
TEST(GuidedMatcher, StringFormats) {
  struct Case {
    const char* format;
    std::vector<const char*> ok, bad;
  };
  const std::vector<Case> cases = {
      {"date", {"2026-12-07"}, {"2026-12-7", "20261207", "2026-12-07T"}},
      {"time", {"10:20:30", "10:20:30.5Z", "23:59:59+01:00"}, {"10:20", "10:20:30.", "1:20:30"}},
      {"date-time",
       {"2026-12-07T10:20:30Z", "2026-12-07T10:20:30.123-05:30"},
       {"2026-12-07 10:20:30Z", "2026-12-07T10:20:30"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000"}},
      {"ipv4", {"192.168.0.1", "255.255.255.255", "0.0.0.0"}, {"256.1.1.1", "1.2.3", "01.2.3.4"}},
      {"email", {"a.b@example.com", "x+y@mail.co.uk"}, {"a@b", "ab.com", "a@@b.com", "a b@c.de"}},
      {"uri",
       {"https://x.org/a?b=1", "mailto:a@b.c", "urn:isbn:1"},
       {"no scheme", "1http://x", "http:"}},
      {"hostname", {"example.com", "a-b.c", "localhost"}, {"-a.com", "a..b", "a_b.com", "a-.b"}},
  };
  for (const Case& c : cases) {
    const auto g = schema(fmt::format(R"({{"type": "string", "format": "{}"}})", c.format).c_str());
    for (const char* v : c.ok) EXPECT_TRUE(accepts(*g, fmt::format("\"{}\"", v))) << v;
    for (const char* v : c.bad) EXPECT_FALSE(accepts(*g, fmt::format("\"{}\"", v))) << v;
  }
  EXPECT_THROW(schema(R"({"type": "string", "format": "ipv6"})"), InvalidArgument);
  EXPECT_THROW(schema(R"({"type": "string", "format": "date", "pattern": "1"})"), InvalidArgument);
  // Without a type, length and format keywords mean a string.
  EXPECT_TRUE(accepts(*schema(R"({"maxLength": 2})"), "\"ab\""));
  EXPECT_FALSE(accepts(*schema(R"({"maxLength": 2})"), "12"));
}

// guided_choice: exactly one of the strings, raw (no quotes, no blanks around).
TEST(GuidedMatcher, Choices) {
  const auto g = choice_grammar({"yes", "no", "yes please", "{x}"});
  for (const char* ok : {"yes", "no", "yes please", "{x}"}) EXPECT_TRUE(accepts(*g, ok)) << ok;
  for (const char* bad : {"", "ye", "maybe", " yes", "yes ", "\"yes\"", "yes pleas", "{x}}"})
    EXPECT_FALSE(accepts(*g, bad)) << bad;
  JsonMatcher m(*g);
  ASSERT_TRUE(m.feed("yes"));
  EXPECT_TRUE(m.can_end());  // or " please" may follow
  EXPECT_FALSE(m.done());
  EXPECT_TRUE(m.feed(" please"));
  EXPECT_TRUE(m.done());
  EXPECT_THROW(choice_grammar({}), InvalidArgument);
  EXPECT_THROW(choice_grammar({"a", ""}), InvalidArgument);
}

// guided_after_think: free text until the first "</think>" (split across tokens here), the JSON
// from the bytes after it; bytes after the tag that do not fit are left before the JSON.
TEST(GuidedOutput, StartsAfterTheThinkEnd) {
  const auto g = json_object_grammar();
  GuidedOutput out(*g, /*after_think=*/true);
  EXPECT_FALSE(out.guiding());
  EXPECT_TRUE(out.feed("<think>\nhmm </th"));
  EXPECT_FALSE(out.guiding());
  EXPECT_TRUE(out.feed("ink>\n\n{\"a"));
  EXPECT_TRUE(out.guiding());
  EXPECT_TRUE(out.feed("\": 1}"));
  EXPECT_TRUE(out.matcher().done());

  GuidedOutput stray(*g, true);
  EXPECT_FALSE(stray.feed("x</think>oops"));
  EXPECT_TRUE(stray.guiding());
  OutputMatcher m = stray.matcher();
  EXPECT_TRUE(m.feed("{}"));  // the JSON starts fresh

  GuidedOutput at_once(*g, false);
  EXPECT_TRUE(at_once.guiding());
  EXPECT_FALSE(at_once.feed("<think>"));
}

// anyOf alternatives that begin alike (Union[A, B] of objects, integer | number) are followed
// side by side until the bytes tell them apart.
TEST(GuidedMatcher, OverlappingAlternativesBranch) {
  const auto pets = schema(R"({"anyOf": [
      {"type": "object", "properties": {"cat": {"type": "boolean"}}, "required": ["cat"]},
      {"type": "object", "properties": {"dog": {"type": "integer"}}, "required": ["dog"]},
      {"type": "array", "items": {"type": "string"}}]})");
  for (const char* ok : {R"({"cat": true})", R"({"dog": 3})", R"(["x"])"})
    EXPECT_TRUE(accepts(*pets, ok)) << ok;
  for (const char* bad : {R"({"cat": 1})", R"({"cat": true, "dog": 1})", "{}", R"({"dog": 1.5})"})
    EXPECT_FALSE(accepts(*pets, bad)) << bad;
  JsonMatcher m(*pets);
  ASSERT_TRUE(m.feed("{\""));
  EXPECT_TRUE(m.in_plain_string() == false);  // a key with candidates: not a plain string

  const auto numbers = schema(R"({"anyOf": [{"type": "integer"}, {"type": "number"},
      {"enum": [12, "x"]}]})");
  for (const char* ok : {"1", "1.5", "12", "\"x\"", "-0.5e3"})
    EXPECT_TRUE(accepts(*numbers, ok)) << ok;
  EXPECT_FALSE(accepts(*numbers, "\"y\""));

  // Nested: an anyOf inside an anyOf alternative, both splitting on '{'.
  const auto nested = schema(R"({"anyOf": [{"anyOf": [
      {"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a"]},
      {"type": "object", "properties": {"b": {"type": "null"}}, "required": ["b"]}]},
      {"type": "object", "properties": {"c": {"type": "null"}}, "required": ["c"]}]})");
  for (const char* ok : {R"({"a": null})", R"({"b": null})", R"({"c": null})"})
    EXPECT_TRUE(accepts(*nested, ok)) << ok;
  EXPECT_FALSE(accepts(*nested, R"({"d": null})"));
}

TEST(GuidedMatcher, UnsupportedSchemasAreRefusedWithTheirPlace) {
  auto refused = [](const char* text, const std::string& part) {
    try {
      json_schema_grammar(text);
      ADD_FAILURE() << "accepted " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused(R"({"type": "string", "format": "ipv6"})", "'/format'");
  refused(R"({"type": "string", "pattern": "a("})", "'/pattern'");
  refused(R"({"properties": {"a": {"type": "number", "multipleOf": 2}}})",
          "'/properties/a/multipleOf'");
  refused(R"({"properties": {"a": {"type": "string", "minContains": 2}}})",
          "'/properties/a/minContains'");
  refused(R"({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}},
              "$ref": "#/$defs/A"})",
          "nests itself");
  refused(R"({"$ref": "#/$defs/Missing"})", "does not name");
  refused(R"({"type": "object", "required": ["x"]})", "'x' is required");
  refused(R"({"type": "date"})", "unknown type 'date'");
  refused("[1", "not valid JSON");
}

}  // namespace
}  // namespace serval::runtime
