// Fuzzing of guided decoding on what clients send: schemas mutated from real ones (wrong types,
// huge numbers, unknown keywords, broken $refs, overlapping and self-referencing anyOf). Compiling
// either works or throws InvalidArgument; a compiled grammar then takes random byte streams and
// documents without crashing, whatever it accepts parses as JSON, and a token mask over a fragment
// vocabulary equals feeding each token to a copy of the matcher.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/engine.h"
#include "runtime/guided_matcher.h"
#include "runtime/guided_vocab.h"
#include "support/fuzz_budget.h"
#include "support/json_mutator.h"

namespace serval::runtime {
namespace {

using nlohmann::json;

const std::vector<json> kSeeds = {
    json::parse(R"({"type": "object", "properties": {"a": {"type": "string"},
        "b": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "c": {"anyOf": [{"type": "number"}, {"type": "null"}]}}, "required": ["a"]})"),
    json::parse(R"({"$defs": {"N": {"type": "object", "properties": {"v": {"enum": [1, "x", true]},
        "next": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]}}}}, "$ref": "#/$defs/N"})"),
    json::parse(R"({"type": ["object", "null"], "additionalProperties": true,
        "properties": {"k": {"const": "c"}}})"),
    json::parse(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1})"),
    json::parse(R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
        {"type": "object", "additionalProperties": true}, {"type": "integer"},
        {"type": "number"}, {"anyOf": [{"enum": [1, "a"]}, {"type": "string"}]}]})"),
};

const std::vector<std::string> kPieces = {
    "{",   "}",     "[",     "]",     ",",        ":",     "\"",   " ",  "\n",
    "a",   "1",     "-",     ".",     "e",        "true",  "null", "\\", "\\u00",
    "x\"", "\"a\"", "\"b\"", "\"v\"", "\"next\"", "\"k\"", "\"c\""};

std::string random_text(std::mt19937& rng) {
  std::string t;
  for (int n = int(rng() % 24); n > 0; --n) t += kPieces[rng() % kPieces.size()];
  return t;
}

TEST(GuidedFuzz, MutatedSchemasCompileOrRefuseAndMatchSafely) {
  testing::JsonMutator mutator(
      testing::fuzz_seed(31),
      {"object", "array", "string", "integer", "number", "boolean", "null", "date", "#/$defs/N",
       "#/$defs/Missing", "#/definitions/N", "a", "v"},
      {"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "$ref",
       "additionalProperties", "minItems", "maxItems", "pattern", "$defs", "title"});
  const GuidedVocab vocab(kPieces, {});
  std::mt19937 rng(testing::fuzz_seed(7));
  int compiled = 0, refused = 0;
  for (int i = 0; i < testing::fuzz_iterations(1500); ++i) {
    json schema = kSeeds[size_t(i) % kSeeds.size()];
    for (int m = 1 + i % 3; m > 0; --m) mutator.mutate(schema);
    std::shared_ptr<const JsonGrammar> g;
    try {
      g = json_schema_grammar(schema.dump());
      ++compiled;
    } catch (const InvalidArgument&) {
      ++refused;
      continue;
    }
    for (int t = 0; t < 4; ++t) {
      JsonMatcher m(*g);
      const std::string text = random_text(rng);
      size_t fed = 0;
      while (fed < text.size() && m.feed(static_cast<unsigned char>(text[fed]))) ++fed;
      if (fed == text.size() && m.can_end() && !text.empty()) {
        ASSERT_FALSE(json::parse(text, nullptr, false).is_discarded())
            << schema.dump() << " accepted " << text;
      }
      // Masks at the point reached agree with token-by-token feeding.
      JsonMatcher at(*g);
      ASSERT_TRUE(at.feed(std::string_view(text).substr(0, fed)));
      std::vector<uint8_t> walked(kPieces.size(), 0);
      vocab.allow_accepted(at, walked);
      for (size_t id = 0; id < kPieces.size(); ++id) {
        JsonMatcher copy = at;
        ASSERT_EQ(bool(walked[id]), copy.feed(kPieces[id]))
            << schema.dump() << " after '" << text.substr(0, fed) << "' token '" << kPieces[id]
            << "'";
      }
    }
  }
  EXPECT_GT(compiled, 100);
  EXPECT_GT(refused, 10);
}

// Regex patterns stitched from syntax pieces compile or are refused (InvalidArgument), and what
// a compiled one accepts is what std::regex_match accepts (where both read the pattern alike).
TEST(GuidedFuzz, RandomRegexesCompileOrRefuse) {
  const std::vector<std::string> pieces = {
      "a", "b",  "(", ")",   "(?:", "|",  "*", "+", "?", "{2}", "{1,3}", "{2,}", "[",
      "]", "[^", "-", "\\d", "\\w", "\\", ".", "^", "$", "{",   "}",     "\\.",  "ab"};
  std::mt19937 rng(testing::fuzz_seed(11));
  int compiled = 0;
  for (int i = 0; i < testing::fuzz_iterations(3000); ++i) {
    std::string pattern;
    for (int n = 1 + int(rng() % 8); n > 0; --n) pattern += pieces[rng() % pieces.size()];
    std::shared_ptr<const JsonGrammar> g;
    try {
      g = regex_grammar(pattern);
    } catch (const InvalidArgument&) {
      continue;
    }
    ++compiled;
    // A ']' first in a class is literal in Python (serval's reading, as vLLM's patterns are
    // Python's); ECMAScript reads "[]" and "[^]" otherwise.
    if (pattern.find("[]") != std::string::npos || pattern.find("[^]") != std::string::npos)
      continue;
    // std::regex backtracks: a repeated group or a repeat of a repeat can take it exponential
    // time on a short text.
    bool nested_repeat = false;
    for (size_t k = 1; k < pattern.size(); ++k) {
      const char prev = pattern[k - 1], c = pattern[k];
      const bool repeat = c == '*' || c == '+' || c == '{' || (c == '?' && prev == ')');
      nested_repeat |= repeat && std::string_view(")*+?}").find(prev) != std::string_view::npos;
    }
    if (nested_repeat) continue;
    std::regex oracle;
    try {
      oracle = std::regex(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      continue;  // syntax std::regex reads differently
    }
    for (int t = 0; t < 8; ++t) {
      std::string text;
      for (int n = int(rng() % 6); n > 0; --n) text += "ab.1_"[rng() % 5];
      JsonMatcher m(*g);
      EXPECT_EQ(m.feed(text) && m.can_end(), std::regex_match(text, oracle))
          << pattern << " on '" << text << "'";
    }
  }
  EXPECT_GT(compiled, 100);
  std::string deep(100000, '(');
  EXPECT_THROW(regex_grammar(deep + "a" + std::string(100000, ')')), InvalidArgument);
}

// Schema texts nested past any reasonable depth are refused, not recursed into.
TEST(GuidedFuzz, DeepSchemasAreRefused) {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"items":)";
  deep += "{}";
  for (int i = 0; i < 100000; ++i) deep += "}";
  EXPECT_THROW(json_schema_grammar(deep), InvalidArgument);
}

}  // namespace
}  // namespace serval::runtime
