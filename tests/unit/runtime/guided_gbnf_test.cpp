// guided_grammar (GBNF): the matcher accepts exactly what independent oracles do — std::regex on
// random non-recursive grammars written both ways, a balance counter on nested brackets,
// nlohmann's parser on JSON documents through a JSON grammar — over every short string of their
// alphabets, byte by byte through UTF-8; token masks equal per-token feeding; malformed and
// left-recursive grammars are refused with their line and column; mutated grammar texts compile
// or are refused, never crash or hang.
#include "runtime/guided_gbnf.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/guided_gbnf_matcher.h"
#include "runtime/guided_vocab.h"
#include "support/each_string.h"

namespace serval::runtime {
namespace {

using serval::testing::each_string;

bool accepts(const GbnfGrammar& g, std::string_view text) {
  GbnfMatcher m(g);
  return m.feed(text) && m.can_end();
}

TEST(GuidedGbnf, HandWrittenGrammarsAgreeWithStdRegex) {
  struct Case {
    const char* grammar;
    const char* regex;
    const char* alphabet;
    size_t max_len;
  };
  const std::vector<Case> cases = {
      {R"(root ::= "yes" | "no")", "yes|no", "yesno", 4},
      {R"(root ::= [0-9]+ ("." [0-9]+)?)", "[0-9]+(\\.[0-9]+)?", "01.a", 5},
      {"root ::= item (\",\" item)*\nitem ::= [a-b]{1,2}", "[a-b]{1,2}(,[a-b]{1,2})*", "ab,c", 6},
      {R"(root ::= "x"{2,} "y"?)", "x{2,}y?", "xy", 6},
      {R"(root ::= ([^a-c] | "ab")*)", "([^a-c]|ab)*", "abcd", 5},
      {"root ::= a b\na ::= \"p\"*\nb ::= \"p\" \"q\"", "p*pq", "pq", 6},
      {R"(root ::= "" | "a" root)", "a*", "ab", 5},
      {R"(root ::= ("a" | "ab") ("bc" | "c"))", "(a|ab)(bc|c)", "abc", 5},
      {"# a comment\nroot ::= x  # trailing\n  | y\nx ::= \"1\"\ny ::= \"2\"{3}", "1|222", "12", 4},
      {R"(root ::= [\-\]] [\x41-\x43] "\t")", "[\\-\\]][A-C]\\t", "-]AD\t", 3},
      {R"(root ::= . "z"{0,2})", "[^]z{0,2}", "az\n", 4},
      {R"(root ::= ("ab"){0} "c")", "c", "abc", 3},
  };
  for (const Case& c : cases) {
    const GbnfGrammar g = compile_gbnf(c.grammar);
    const std::regex oracle(c.regex, std::regex::ECMAScript);
    each_string(c.alphabet, c.max_len, [&](const std::string& s) {
      ASSERT_EQ(accepts(g, s), std::regex_match(s, oracle)) << c.grammar << " on '" << s << "'";
    });
  }
}

// A random expression written as GBNF and as an ECMAScript regex (no recursion: both describe
// the same regular language).
struct RandomExpr {
  std::mt19937& rng;
  int budget;

  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }

  void atom(std::string& gbnf, std::string& regex) {
    switch (pick(4)) {
      case 0: {
        const char c = "abc"[pick(3)];
        gbnf += std::string("\"") + c + "\"";
        regex += c;
        return;
      }
      case 1:
        gbnf += "\"ab\"";
        regex += "(?:ab)";
        return;
      case 2:
        if (pick(2)) {
          gbnf += "[a-b]";
          regex += "[a-b]";
        } else {
          gbnf += "[^a]";
          regex += "[^a]";
        }
        return;
      default:
        if (budget-- <= 0) return atom(gbnf, regex);
        gbnf += "(";
        regex += "(?:";
        alternatives(gbnf, regex);
        gbnf += ")";
        regex += ")";
    }
  }

  void item(std::string& gbnf, std::string& regex) {
    std::string g, r;
    atom(g, r);
    // Regex atoms must be one unit before a quantifier.
    if (r.size() > 1 && r[0] != '(' && r[0] != '[') r = "(?:" + r + ")";
    if (r[0] == '[' && r.back() != ']') r = "(?:" + r + ")";
    static const char* kSuffix[] = {"", "", "*", "+", "?", "{2}", "{0,2}", "{1,}"};
    const char* s = kSuffix[pick(8)];
    gbnf += g + s;
    regex += r + s;
  }

  void sequence(std::string& gbnf, std::string& regex) {
    const int n = 1 + pick(3);
    for (int i = 0; i < n; ++i) {
      gbnf += " ";
      item(gbnf, regex);
    }
  }

  void alternatives(std::string& gbnf, std::string& regex) {
    sequence(gbnf, regex);
    while (pick(3) == 0) {
      gbnf += " |";
      regex += "|";
      sequence(gbnf, regex);
    }
  }
};

TEST(GuidedGbnf, RandomGrammarsAgreeWithStdRegex) {
  std::mt19937 rng(20261207);
  int compiled = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string gbnf = "root ::=", regex;
    RandomExpr{rng, 3}.alternatives(gbnf, regex);
    GbnfGrammar g;
    try {
      g = compile_gbnf(gbnf);
    } catch (const InvalidArgument& e) {
      // Only a repetition of something that can be empty is refused here.
      EXPECT_NE(std::string(e.what()).find("left-recursive"), std::string::npos) << gbnf;
      continue;
    }
    ++compiled;
    const std::regex oracle(regex, std::regex::ECMAScript);
    each_string("abc", 5, [&](const std::string& s) {
      ASSERT_EQ(accepts(g, s), std::regex_match(s, oracle))
          << gbnf << " vs " << regex << " on '" << s << "'";
    });
  }
  EXPECT_GT(compiled, 200);
}

// Recursion: every prefix with no more closes than opens is taken, and exactly the balanced
// strings end.
TEST(GuidedGbnf, NestedBracketsAgreeWithACounter) {
  const GbnfGrammar g = compile_gbnf("root ::= (\"(\" root \")\" | \"[\" root \"]\")*");
  each_string("()[", 10, [&](const std::string& s) {
    // The oracle: a stack of open brackets ("[" closes with "]", not in the alphabet, so a "["
    // can never be followed by ")" directly above it).
    std::string open;
    bool viable = true;
    for (char c : s) {
      if (c == ')') {
        if (open.empty() || open.back() != '(') {
          viable = false;
          break;
        }
        open.pop_back();
      } else {
        open.push_back(c);
      }
    }
    GbnfMatcher m(g);
    ASSERT_EQ(m.feed(s), viable) << s;
    if (viable) {
      EXPECT_EQ(m.can_end(), open.empty()) << s;
    }
  });
  GbnfMatcher deep(g);
  EXPECT_TRUE(deep.feed(std::string(100, '(') + std::string(100, ')')));
  EXPECT_TRUE(deep.can_end());
  GbnfMatcher too_deep(g);
  EXPECT_FALSE(too_deep.feed(std::string(kMaxGbnfDepth + 1, '(')));
}

TEST(GuidedGbnf, JsonGrammarAcceptsDocumentsNlohmannParses) {
  const GbnfGrammar g = compile_gbnf(R"(
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n\r]*
)");
  std::mt19937 rng(7);
  std::function<nlohmann::json(int)> random_value = [&](int depth) -> nlohmann::json {
    switch (std::uniform_int_distribution<int>(0, depth > 3 ? 3 : 5)(rng)) {
      case 0:
        return std::uniform_int_distribution<int>(-1000, 1000)(rng);
      case 1:
        return std::uniform_real_distribution<double>(-1e6, 1e6)(rng);
      case 2:
        return std::string("t\xc3\xa9x\"t\n\\") + std::to_string(rng() % 100);
      case 3:
        return rng() % 2 ? nlohmann::json(nullptr) : nlohmann::json(bool(rng() % 2));
      case 4: {
        nlohmann::json a = nlohmann::json::array();
        for (int i = int(rng() % 4); i > 0; --i) a.push_back(random_value(depth + 1));
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (int i = int(rng() % 4); i > 0; --i)
          o["k" + std::to_string(rng() % 10)] = random_value(depth + 1);
        return o;
      }
    }
  };
  for (int i = 0; i < 200; ++i) {
    const nlohmann::json doc = random_value(0);
    const std::string text = doc.dump(i % 2 ? 2 : -1);
    EXPECT_TRUE(accepts(g, text)) << text;
    // A cut document is a prefix that does not end (unless what is left is itself JSON).
    const std::string cut = text.substr(0, text.size() / 2);
    GbnfMatcher m(g);
    EXPECT_TRUE(m.feed(cut)) << cut;
    EXPECT_EQ(m.can_end(), nlohmann::json::accept(cut)) << cut;
  }
  for (const char* bad : {"{\"a\" 1}", "[1,]", "01", "\"\\x\"", "{,}", "tru", "[\"\x01\"]"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
}

TEST(GuidedGbnf, MatchesCodePointsThroughUtf8Bytes) {
  // α-ω is U+03B1..U+03C9 (CE B1 .. CF 89); "€" is E2 82 AC.
  const GbnfGrammar g = compile_gbnf(R"(root ::= [α-ω]+ | "€" | [^\x00-\x7F] "!")");
  EXPECT_TRUE(accepts(g, "\xce\xb1\xcf\x89"));  // αω
  EXPECT_TRUE(accepts(g, "\xe2\x82\xac"));
  EXPECT_TRUE(accepts(g, "\xf0\x9f\x98\x80!"));  // an emoji, then "!"
  EXPECT_FALSE(accepts(g, "a!"));
  GbnfMatcher m(g);
  EXPECT_TRUE(m.feed("\xe2\x82"));  // a prefix of "€" (and of other non-ASCII characters)
  EXPECT_FALSE(m.can_end());        // a character in progress never ends
  // Invalid UTF-8 is refused at the byte that makes it so.
  for (const char* bad : {"\xc0\xaf", "\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x28"}) {
    GbnfMatcher b(g);
    EXPECT_FALSE(b.feed(bad)) << bad;
  }
  // Ω (U+03A9, CE A9) is outside α-ω: refused at its second byte when no other class holds it.
  const GbnfGrammar greek = compile_gbnf(R"(root ::= [α-ω])");
  GbnfMatcher lead(greek);
  EXPECT_TRUE(lead.feed("\xce"));
  GbnfMatcher omega = lead;
  EXPECT_FALSE(omega.feed("\xa9"));
  EXPECT_TRUE(lead.feed("\xb1"));
  EXPECT_TRUE(lead.done());
  GbnfMatcher wrong_lead(greek);
  EXPECT_FALSE(wrong_lead.feed("\xe2"));  // no character in U+2000..U+2FFF is Greek here
  // A lead byte alone stands for characters of its length only: none of them is ASCII.
  const GbnfGrammar ascii = compile_gbnf(R"(root ::= [a-z] [,.])");
  for (const char* lead : {"\xc2", "\xe0", "\xf0", "\xf4"}) {
    GbnfMatcher a(ascii);
    EXPECT_TRUE(a.feed("x"));
    EXPECT_FALSE(a.feed(lead)) << lead;
  }
  // ED leads U+D000..U+D7FF only (the rest are surrogates).
  const GbnfGrammar high = compile_gbnf(R"(root ::= [\uD7FF-\uE000])");
  GbnfMatcher ed(high);
  EXPECT_TRUE(ed.feed("\xed\x9f"));
  EXPECT_TRUE(ed.feed("\xbf"));
  EXPECT_TRUE(ed.done());
  const GbnfGrammar above = compile_gbnf(R"(root ::= [\uE000-\uEFFF])");
  GbnfMatcher none(above);
  EXPECT_FALSE(none.feed("\xed"));
}

TEST(GuidedGbnf, DoneOnlyWhenNothingMayFollow) {
  const GbnfGrammar g = compile_gbnf(R"(root ::= "ab" "c"?)");
  GbnfMatcher m(g);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.feed("ab"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.done());
  EXPECT_TRUE(m.feed("c"));
  EXPECT_TRUE(m.done());
  EXPECT_FALSE(m.feed("c"));
}

TEST(GuidedGbnf, MaskEqualsBruteForce) {
  const GbnfGrammar g = compile_gbnf(R"(
root ::= greeting " " name ("!" | "?")
greeting ::= "hi" | "hello" | "hey"
name ::= [A-Z] [a-z]* | "\u00e9l\u00e8ve")");
  const std::vector<std::string> vocab = {
      "h",        "hi", "hel", "hello",     "lo", "hey ",  " ",           " A",
      "Ab",       "b",  "bc!", "!",         "?",  "\xc3",  "\xa9",        "l",
      "\xc3\xa8", "ve", "ve!", "\xc3\xa9l", "x",  "hi A!", "\xe2\x82\xac"};
  const GuidedVocab v(vocab, {});
  for (const std::string doc : {"hi Abc!", "hey \xc3\xa9l\xc3\xa8ve?"}) {
    GbnfMatcher m(g);
    for (size_t i = 0; i <= doc.size(); ++i) {
      std::vector<uint8_t> walked(vocab.size(), 0);
      v.allow_accepted(m, walked);
      for (size_t id = 0; id < vocab.size(); ++id) {
        GbnfMatcher copy = m;
        const bool fits = copy.feed(vocab[id]);
        EXPECT_EQ(bool(walked[id]), fits)
            << "'" << vocab[id] << "' after '" << doc.substr(0, i) << "'";
      }
      if (i < doc.size()) {
        ASSERT_TRUE(m.feed(static_cast<unsigned char>(doc[i]))) << doc;
      }
    }
    EXPECT_TRUE(m.done());
  }
}

// Masks remembered per state stay equal to brute force when states recur, and after the oldest
// are forgotten (kMaxGbnfMasks); trim() starts a fresh state table only when no copy shares it,
// and the matcher goes on as before.
TEST(GuidedGbnf, RememberedMasksAndTrim) {
  const GbnfGrammar g = compile_gbnf(R"(root ::= [a-c]{0,100} "." | "x" root)");
  const std::vector<std::string> vocab = {"a", "b", "ab", "c.", ".", "x", "xa", "d"};
  const GuidedVocab v(vocab, {});
  auto check = [&](const GbnfMatcher& m, const std::string& where) {
    std::vector<uint8_t> walked(vocab.size(), 0);
    v.allow_accepted(m, walked);
    for (size_t id = 0; id < vocab.size(); ++id) {
      GbnfMatcher copy = m;
      const bool fits = copy.feed(vocab[id]);
      EXPECT_EQ(bool(walked[id]), fits) << vocab[id] << " at " << where;
    }
  };
  const GbnfMatcher start(g);
  GbnfMatcher m = start;
  check(start, "start");
  for (size_t i = 0; i < kMaxGbnfMasks + 8; ++i) {
    check(m, std::to_string(i) + " letters");
    ASSERT_TRUE(m.feed("b"));
  }
  check(start, "start, its mask forgotten");
  check(start, "start again");
  ASSERT_TRUE(m.feed("c."));
  EXPECT_TRUE(m.done());

  const GbnfGrammar many = compile_gbnf("root ::= word{0,1000}\nword ::= [a-z]{20} \" \"");
  GbnfMatcher long_run(many);
  const std::string word = std::string(20, 'q') + " ";
  while (long_run.num_states() <= kMaxGbnfStates) ASSERT_TRUE(long_run.feed(word));
  {
    const GbnfMatcher copy = long_run;
    long_run.trim();
    EXPECT_GT(long_run.num_states(), kMaxGbnfStates);  // shared: kept
  }
  long_run.trim();
  EXPECT_EQ(long_run.num_states(), 1u);
  EXPECT_TRUE(long_run.can_end());
  EXPECT_FALSE(GbnfMatcher(long_run).feed("q "));
  EXPECT_TRUE(long_run.feed(word));
  EXPECT_TRUE(long_run.can_end());
}

// Each malformed grammar is refused with its line and column and what is wrong.
TEST(GuidedGbnf, RefusesMalformedGrammarsSayingWhere) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"root ::= x", "line 1, column 10: rule 'x' is used but not defined"},
      {"start ::= \"a\"", "no 'root' rule"},
      {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
      {"root ::= \"a", "line 1, column 10: unterminated string literal"},
      {"root ::= [a-", "unterminated character class"},
      {"root ::= []", "empty character class"},
      {"root ::= [z-a]", "reversed"},
      {"root ::= (\"a\"", "unclosed '('"},
      {"root ::= \"a\"{3,1}", "the maximum is below the minimum"},
      {"root ::= \"a\"{2000}", "at most 1000"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= \"\\uD800\"", "not a Unicode scalar value"},
      {"root = \"a\"", "expected '::=' after 'root'"},
      {"root ::= \"a\" )", "line 1, column 14: expected a rule name, found ')'"},
      {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"",
       "line 2, column 1: rule 'expr' is left-recursive"},
      {"root ::= (\"a\"?)*", "rule 'root' is left-recursive"},
      {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "left-recursive"},
      {"root ::= \"\xff\"", "invalid UTF-8"},
  };
  for (const auto& [text, message] : cases) {
    try {
      compile_gbnf(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
          << text << " → " << e.what();
    }
  }
}

// Grammars built to be expensive are refused or stay cheap: groups nested thousands deep, a
// chain of thousands of rules before any character (the matcher would recurse that deep), and
// alternatives that match nothing alike (each doubling the ways to the same stack).
TEST(GuidedGbnf, AdversarialGrammarsAreRefusedOrStayCheap) {
  const std::string deep = "root ::= " + std::string(5000, '(') + "\"a\"" + std::string(5000, ')');
  EXPECT_THROW(compile_gbnf(deep), InvalidArgument);
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 5000; ++i) chain += fmt::format("r{} ::= r{}\n", i, i + 1);
  chain += "r5000 ::= \"a\"";
  try {
    compile_gbnf(chain);
    ADD_FAILURE() << "a 5000-rule chain compiled";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rules deep before any character"), std::string::npos)
        << e.what();
  }
  std::string doubling = "root ::=";
  for (int i = 0; i < 200; ++i) doubling += " x";
  doubling += " \"a\"\nx ::= \"\" | \"\"";
  const auto t0 = std::chrono::steady_clock::now();
  const GbnfGrammar g = compile_gbnf(doubling);
  EXPECT_TRUE(accepts(g, "a"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(GuidedGbnf, MutatedGrammarsCompileOrRefuseAndMatchSafely) {
  const std::vector<std::string> seeds = {
      "root ::= (\"a\" | [b-d]+ x)* \"!\"\nx ::= \"(\" root \")\" | \"\"",
      "root ::= [^\\n]{0,5} \"\\u00e9\"? # c\n",
      "root ::= a{2,3}\na ::= \"x\" | \"yz\"",
  };
  const std::string junk = "\"[]()|*+?{},.-^\\#:= \naxy0\xc3";
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = seeds[rng() % seeds.size()];
    for (int edits = 1 + int(rng() % 3); edits > 0; --edits) {
      const size_t at = rng() % (text.size() + 1);
      if (rng() % 2 && at < text.size())
        text.erase(at, 1);
      else
        text.insert(at, 1, junk[rng() % junk.size()]);
    }
    try {
      const GbnfGrammar g = compile_gbnf(text);
      GbnfMatcher m(g);
      for (int i = 0; i < 40; ++i) {
        GbnfMatcher copy = m;
        if (copy.feed(static_cast<unsigned char>("ab(!)x\n\xc3\xa9yz"[rng() % 13]))) m = copy;
        (void)m.can_end();
      }
    } catch (const InvalidArgument&) {
    }
  }
}

}  // namespace
}  // namespace serval::runtime
