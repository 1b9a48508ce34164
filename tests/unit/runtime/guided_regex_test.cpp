// guided_regex: the position automaton accepts exactly what std::regex_match does (ECMAScript, on
// the common subset) for many patterns and every short string over their alphabets; token masks
// equal per-token feeding; unsupported syntax is refused with its offset.
#include "runtime/guided_regex.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/engine.h"
#include "runtime/guided_matcher.h"
#include "runtime/guided_vocab.h"
#include "support/each_string.h"

namespace serval::runtime {
namespace {

using serval::testing::each_string;

bool accepts(const JsonGrammar& g, std::string_view text) {
  JsonMatcher m(g);
  return m.feed(text) && m.can_end();
}

TEST(GuidedRegex, AgreesWithStdRegex) {
  struct Case {
    const char* pattern;
    const char* oracle;  // the same for std::regex where its syntax differs
    const char* alphabet;
    size_t max_len;
  };
  const std::vector<Case> cases = {
      {"\\d{2}-\\d", nullptr, "12-a", 5},
      {"(yes|no)", nullptr, "yesno", 4},
      {"[A-Z][a-z]+", nullptr, "Aab1", 4},
      {"\\w+@\\w\\.com", nullptr, "a_@.com", 7},
      {"a*b?c+", nullptr, "abc", 5},
      {"(ab|a)(bc|c)", nullptr, "abc", 5},
      {"x{2,4}", nullptr, "xy", 6},
      {"x{2,}y", nullptr, "xy", 6},
      {"[^abc]+", nullptr, "abcd-", 4},
      {"(?:ab)*", "(?:ab)*", "ab", 6},
      {"(?P<y>\\d{2})-(\\d)", "(\\d{2})-(\\d)", "12-", 5},
      {"^(true|false)$", nullptr, "truefals", 5},
      {"", nullptr, "a", 2},
      {"a|", nullptr, "ab", 2},
      {".{0,2}z", nullptr, "az\n", 4},
      {"[a\\-z\\]]+", nullptr, "az-]b", 3},
      {"\\s\\S\\W", nullptr, " a.\t", 3},
      {"(a|b)*?c", "(a|b)*c", "abc", 5},
      {"[0-9a-f]{2}\\.?", nullptr, "0af.g", 4},
  };
  for (const Case& c : cases) {
    const auto g = regex_grammar(c.pattern);
    const std::regex oracle(c.oracle ? c.oracle : c.pattern, std::regex::ECMAScript);
    each_string(c.alphabet, c.max_len, [&](const std::string& s) {
      ASSERT_EQ(accepts(*g, s), std::regex_match(s, oracle))
          << "pattern " << c.pattern << " on '" << s << "'";
    });
  }
}

TEST(GuidedRegex, MaskEqualsBruteForce) {
  const auto g = regex_grammar("(\\d+|true)-[a-z]{1,3}");
  const std::vector<std::string> vocab = {"1",  "12", "-",   "-a",   "a", "ab", "true", "tr",
                                          "ue", "3-", "abc", "abcd", "x", " ",  "1-ab", "\""};
  const GuidedVocab v(vocab, {});
  JsonMatcher m(*g);
  for (const char c : std::string("12-ab")) {
    std::vector<uint8_t> walked(vocab.size(), 0);
    v.allow_accepted(m, walked);
    for (size_t id = 0; id < vocab.size(); ++id) {
      JsonMatcher copy = m;
      EXPECT_EQ(bool(walked[id]), copy.feed(vocab[id])) << vocab[id];
    }
    ASSERT_TRUE(m.feed(static_cast<unsigned char>(c)));
  }
  EXPECT_TRUE(m.can_end());
}

TEST(GuidedRegex, RefusesWhatItDoesNotSupport) {
  for (const char* bad : {"a(b", "a)b", "[ab", "*a", "a{2", "a{3,1}", "\\bword", "a$b", "(?=x)",
                          "a{64}", "[z-a]", "(a{8}){8}"})
    EXPECT_THROW(regex_grammar(bad), InvalidArgument) << bad;
}

}  // namespace
}  // namespace serval::runtime
