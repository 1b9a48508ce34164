// Hostile or broken chat templates: nesting, recursion, loops and sizes past the engine's
// budgets are clear errors (LoadError at load, InvalidArgument at render), never a stack
// overflow, a hang or gigabytes of memory; and a token-soup fuzz of the whole parse + render.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "support/fuzz_budget.h"
#include "tokenizer/chat_template.h"

namespace serval::tokenizer {
namespace {

using nlohmann::ordered_json;

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

std::string render(const std::string& source) {
  const ordered_json messages = ordered_json::parse(
      R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}])");
  return ChatTemplate(source).render(messages, true, nullptr, "<s>", "</s>");
}

template <typename E>
void expect_error(const std::string& source, const std::string& needle) {
  try {
    render(source);
    ADD_FAILURE() << "no error for a template of " << source.size() << " bytes";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(JinjaLimits, DeepNestingFailsAtLoad) {
  const int n = 100000;
  expect_error<LoadError>("{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}", "nested deeper");
  expect_error<LoadError>("{{ " + repeat("[", n) + repeat("]", n) + " }}", "nested deeper");
  expect_error<LoadError>("{{ " + repeat("not ", n) + "true }}", "nested deeper");
  expect_error<LoadError>("{{ " + repeat("-", n) + "1 }}", "nested deeper");
  expect_error<LoadError>("{{ 1" + repeat(" + 1", n) + " }}", "nested deeper");
  expect_error<LoadError>("{{ 'a'" + repeat("|upper", n) + " }}", "nested deeper");
  expect_error<LoadError>("{{ x" + repeat(".y", n) + " }}", "nested deeper");
  expect_error<LoadError>("{{ 1" + repeat(" if true else 1", n) + " }}", "nested deeper");
  expect_error<LoadError>(repeat("{% if true %}", n) + repeat("{% endif %}", n), "nested deeper");
  expect_error<LoadError>(repeat("{% for i in [1] %}", n) + repeat("{% endfor %}", n),
                          "nested deeper");
}

TEST(JinjaLimits, NestingWithinTheLimitRenders) {
  EXPECT_EQ(render("{{ " + repeat("(", 60) + "7" + repeat(")", 60) + " }}"), "7");
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 90) + " }}"), "91");
  EXPECT_EQ(render(repeat("{% if true %}", 60) + "x" + repeat("{% endif %}", 60)), "x");
  EXPECT_EQ(render("{{ " + repeat("not ", 50) + "true }}"), "True");
}

TEST(JinjaLimits, UnboundedMacroRecursionIsARenderError) {
  expect_error<InvalidArgument>("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                                "macro calls nested deeper");
  // Bounded recursion (nested tool schemas render this way) is fine.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}({{ f(n - 1) }}){% endif %}{% endmacro %}"
                   "{{ f(20) }}"),
            repeat("(", 20) + repeat(")", 20));
}

TEST(JinjaLimits, LoopBudget) {
  const auto start = std::chrono::steady_clock::now();
  expect_error<InvalidArgument>(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
      "loop iterations");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(render("{% for i in range(1000) %}{% for j in range(100) %}{% endfor %}{% endfor %}"
                   "done"),
            "done");
}

// Values referring to themselves or nested without bound (str / tojson recursed until the
// stack overflowed): a namespace cannot hold a namespace, values nest at most 128 levels.
TEST(JinjaLimits, SelfReferenceAndDeepValues) {
  expect_error<InvalidArgument>("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}",
                                "cannot hold a namespace");
  expect_error<InvalidArgument>("{% set ns = namespace(a=1) %}{% set ns.a = [{'k': ns}] %}",
                                "cannot hold a namespace");
  expect_error<InvalidArgument>("{% set a = namespace(x=1) %}{% set b = namespace(y=a) %}",
                                "cannot hold a namespace");
  expect_error<InvalidArgument>(
      "{% set ns = namespace(a=1) %}{% for i in range(100000) %}{% set ns.a = [ns.a] %}"
      "{% endfor %}{{ ns.a }}",
      "nested deeper than 128");
  expect_error<InvalidArgument>(
      "{% set ns = namespace(a=1) %}{% for i in range(100000) %}{% set ns.a = {'k': ns.a} %}"
      "{% endfor %}{{ ns.a|tojson }}",
      "nested deeper than 128");
  // Within the limits: nesting, and namespaces in lists outside namespaces (shared state).
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = [ns.a] %}"
                   "{% endfor %}{{ ns.a|tojson }}"),
            "[[[1]]]");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set l = [ns] %}{% set ns.a = 5 %}"
                   "{{ l[0].a }}"),
            "5");
}

// 64-bit integers: overflow is an error (it wrapped; ** looped `exponent` times; INT64_MIN // -1
// was a SIGFPE), results that fit match Python.
TEST(JinjaLimits, IntegerOverflowIsAnError) {
  for (const char* t :
       {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
        "{{ 4611686018427387904 * 2 }}", "{{ 2 ** 9999 }}", "{{ 3 ** 9223372036854775807 }}",
        "{{ (-9223372036854775807 - 1) // -1 }}", "{{ -(-9223372036854775807 - 1) }}",
        "{{ (-9223372036854775807 - 1)|abs }}"})
    expect_error<InvalidArgument>(t, "integer overflow");
  expect_error<LoadError>("{{ 99999999999999999999 }}", "does not fit in 64 bits");
  EXPECT_EQ(render("{{ (-2) ** 63 }} {{ 2 ** 62 }} {{ 1 ** 9223372036854775807 }} "
                   "{{ (-1) ** 9223372036854775807 }} {{ 0 ** 0 }}"),
            "-9223372036854775808 4611686018427387904 1 -1 1");
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }} {{ 7 // -2 }} {{ 7 % -2 }} "
                   "{{ -7 // 2 }} {{ 9223372036854775806 + 1 }}"),
            "0 -4 -1 -4 9223372036854775807");
}

// Shared sub-lists make values whose walks are huge though cheap to build: printing, tojson,
// unique or comparing them ran for minutes; the render's work budget stops them in < 1 s.
TEST(JinjaLimits, WorkBudget) {
  const auto start = std::chrono::steady_clock::now();
  for (const char* t : {"{{ ([[0] * 100000] * 100000)|tojson|length }}",
                        "{{ ([[0] * 100000] * 100000)|string|length }}",
                        "{{ ([[0] * 100000] * 100000)|unique|list|length }}",
                        "{{ ([[0] * 100000] * 100000) == ([[0] * 100000] * 100000) }}"})
    expect_error<InvalidArgument>(t, "too much work");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(render("{{ ([[0] * 1000] * 1000)|tojson|length }}"), "3002000");
}

TEST(JinjaLimits, SizeBudgets) {
  expect_error<InvalidArgument>("{{ 'x' * 1000000000 }}", "at most");
  expect_error<InvalidArgument>("{{ [1, 2] * 1000000000 }}", "at most");
  expect_error<InvalidArgument>("{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}",
                                "the rendered text would make");
  // Doubling by concatenation, replace and join expansion, a huge or negative indent width.
  expect_error<InvalidArgument>(
      "{% set ns = namespace(s='xx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s|length }}",
      "at most");
  expect_error<InvalidArgument>(
      "{% set ns = namespace(s=[1]) %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}{{ ns.s|length }}",
      "at most");
  expect_error<InvalidArgument>("{{ ('a' * 10000000)|replace('a', 'bbbbbbbbbb') }}", "at most");
  expect_error<InvalidArgument>("{{ ('a' * 10000000).replace('a', 'bbbbbbbbbb') }}", "at most");
  expect_error<InvalidArgument>("{{ (['a' * 1000] * 100000)|join('b') }}", "at most");
  expect_error<InvalidArgument>("{{ 'x'|indent(1000000000000) }}", "at most");
  expect_error<InvalidArgument>("{{ [1, [2]]|tojson(indent=1000000000) }}", "at most 4096");
  expect_error<InvalidArgument>("{{ 1e300|int }}", "integer overflow");
  expect_error<InvalidArgument>("{{ (1e300 * 1e300)|int }}", "infinity");
  EXPECT_EQ(render("{{ 3.9|int }} {{ -3.9|int }} {{ '2.5'|int }} {{ ('nan'|float)|int(7) }}"),
            "3 -3 2 7");
  EXPECT_EQ(render("{{ 'a\nb'|indent(-3) }}|{{ 'a\nb'|indent(2) }}"), "a\nb|a\n  b");
  // Empty and non-positive repeats are empty, at once.
  EXPECT_EQ(render("[{{ '' * 1000000000000000000 }}][{{ 'ab' * -3 }}][{{ ([] * 1000000000)|length "
                   "}}]"),
            "[][][0]");
  EXPECT_EQ(render("{{ ('ab' * 3) ~ ([1] * 2)|string }}"), "ababab[1, 1]");
}

// Random sequences of template fragments: parse + render must succeed or throw LoadError /
// InvalidArgument (serval::Error), and finish quickly.
TEST(JinjaLimits, TokenSoupFuzz) {
  static const std::vector<std::string> pieces = {
      "{{ ",        " }}",       "{% ",      " %}",
      "{%- ",       " -%}",      "if ",      "elif ",
      "else",       "endif",     "for ",     " in ",
      "endfor",     "set ",      " = ",      "macro ",
      "endmacro",   "call ",     "endcall",  "(",
      ")",          "[",         "]",        "{",
      "}",          ",",         ":",        ".",
      "|",          "x",         "messages", "m",
      "loop.index", "range(3)",  "'s'",      "\"t\"",
      "1",          "-2",        "3.5",      "true",
      "none",       " not ",     " and ",    " or ",
      " is ",       " defined",  "+",        "-",
      "*",          "/",         "//",       "%",
      "**",         "~",         "==",       "<",
      " if ",       " else ",    "length",   "tojson",
      "upper",      "join(',')", "items()",  "raise_exception('r')",
      "text ",      "\n",        "{# c #}",  "namespace(a=1)",
      "ns.a",       "caller()",  "break",    "continue"};
  std::mt19937 rng(testing::fuzz_seed(12345));
  const auto start = std::chrono::steady_clock::now();
  const int iterations = testing::fuzz_iterations(20000);
  for (int i = 0; i < iterations; ++i) {
    std::string source;
    const int n = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int k = 0; k < n; ++k)
      source += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
    try {
      render(source);
    } catch (const Error&) {
      // LoadError, InvalidArgument: both serval::Error
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a serval::Error: " << e.what() << "\ntemplate: " << source;
      return;
    }
  }
  if (iterations <= 20000)
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

// The fixtures' real chat templates (Llama 3, Qwen3, Mixtral) with random byte-level damage
// (flips, insertions of template syntax, deletions, duplicated spans), rendered with a
// conversation that has tools and a tool call: success or a serval::Error only.
TEST(JinjaLimits, DamagedRealTemplatesFuzz) {
  std::vector<std::string> templates;
  for (const char* model : {"llama", "qwen3", "mixtral"}) {
    std::ifstream f(std::string(SERVAL_SOURCE_DIR) + "/tests/fixtures/" + model +
                    "/tokenizer_config.json");
    ASSERT_TRUE(f) << model;
    const ordered_json config = ordered_json::parse(f);
    ASSERT_TRUE(config.contains("chat_template") && config["chat_template"].is_string()) << model;
    templates.push_back(config["chat_template"].get<std::string>());
  }
  const ordered_json messages = ordered_json::parse(R"([
    {"role":"system","content":"Be brief."},{"role":"user","content":"Weather?"},
    {"role":"assistant","content":"","tool_calls":[{"type":"function","function":
      {"name":"get","arguments":{"city":"Paris"}}}]},
    {"role":"tool","content":"sunny"},{"role":"user","content":"Thanks"}])");
  const ordered_json tools = ordered_json::parse(R"([{"type":"function","function":{"name":"get",
    "description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  static const char* inserts[] = {"{{", "}}",   "{%",    "%}",    "(", ")", "[", "]", "|", "'",
                                  "\"", " if ", " for ", " not ", "*", "~", ".", ",", "-", "endif"};
  std::mt19937 rng(testing::fuzz_seed(99));
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int rendered = 0;
  const int iterations = testing::fuzz_iterations(3000);
  for (int i = 0; i < iterations; ++i) {
    std::string source = templates[pick(templates.size())];
    for (int k = int(pick(4)); k >= 0 && !source.empty(); --k) {
      const size_t at = pick(source.size());
      switch (pick(4)) {
        case 0:
          source[at] = char(32 + pick(95));
          break;
        case 1:
          source.insert(at, inserts[pick(std::size(inserts))]);
          break;
        case 2:
          source.erase(at, 1 + pick(8));
          break;
        default: {
          const size_t len = std::min<size_t>(1 + pick(40), source.size() - at);
          source.insert(pick(source.size()), source.substr(at, len));
          break;
        }
      }
    }
    try {
      ChatTemplate(source).render(messages, true, tools, "<s>", "</s>");
      ++rendered;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a serval::Error: " << e.what() << "\ntemplate: " << source;
      return;
    }
  }
  EXPECT_GT(rendered, iterations / 50);  // the damage leaves some templates working
}

}  // namespace
}  // namespace serval::tokenizer
