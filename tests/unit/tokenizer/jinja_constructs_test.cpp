// Hand-written templates exercising each supported Jinja construct, rendered by serval and
// by Python Jinja2 (transformers' environment); plus load-time and raise_exception errors.
#include <gtest/gtest.h>

#include "base/error.h"
#include "chat_template/oracle_runner.h"
#include "tokenizer/chat_template.h"

namespace serval::tokenizer {
namespace {

using nlohmann::ordered_json;

const char* kMessages = R"([{"role":"system","content":"Sys"},{"role":"user","content":"Hi 🎉"},
  {"role":"assistant","content":"Yo","tool_calls":[{"function":{"name":"f","arguments":{"a":1,"b":[1.5,null,true]}}}]},
  {"role":"user","content":"  Bye  "}])";

// Each template renders with messages above, add_generation_prompt=true, tools=null,
// bos_token "<s>", eos_token "</s>".
const char* kTemplates[] = {
    // whitespace control, trim_blocks, lstrip_blocks, comments
    "A\n  {% if true %}\n    B\n  {% endif %}\nC {#- note -#}  D\n{{- ' E ' -}}\n F{# c #}\nG\n",
    "{%+ if true %}x{% endif +%}\n  {%- if true -%}  y  {%- endif %}\n z{{ 1 }}\n",
    "{% raw %}{{ not parsed }}{% endraw %}|{{ 'ok' }}",
    // if / elif / else, tests
    "{% for v in [0, 1, 2, none, 'a', [1], {}, 1.5, true] %}{% if v is none %}N{% elif v is "
    "string %}S{% elif v is mapping %}M{% elif v is boolean %}B{% elif v is integer %}I"
    "{% elif v is number %}F{% elif v is sequence %}Q{% else %}?{% endif %}{% endfor %}",
    "{{ x is defined }}{{ x is undefined }}{{ messages is iterable }}{{ 3 is odd }}{{ 4 is even }}"
    "{{ 3 is divisibleby 3 }}{{ raise_exception is callable }}{{ true is true }}{{ 0 is false }}"
    "{{ 'a' is in 'abc' }}{{ 2 is equalto 2 }}{{ 2 is eq 2.0 }}{{ 1 is not none }}",
    // for with else, loop variables, filter condition, unpacking, break/continue
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/"
    "{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/"
    "{{ loop.previtem.role if loop.previtem is defined else '-' }}/"
    "{{ loop.nextitem.role if loop.nextitem is defined else '-' }};{% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }}|{% else %}none"
    "{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}",
    "{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }};{% endfor %}"
    "{% for k, v in {'z': 1, 'y': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}"
    "{% endif %}{{ i }}{{ loop.cycle('a', 'b') }}{% endfor %}{{ range(2, 11, 3) | list }}",
    // set, namespace, block set, scoping
    "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"
    "{% set ns = namespace(total=0, s='') %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i"
    " %}{% endfor %}{{ ns.total }}{% if true %}{% set y = 5 %}{% endif %}{{ y }}"
    "{% set blk %}[{{ x }}]{% endset %}{{ blk }}{% set a, b = 1, 2 %}{{ a }}{{ b }}",
    // macro and call
    "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}"
    "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}"
    "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
    "{% call wrap('b') %}in {{ messages[1].role }}{% endcall %}",
    // filters
    "{{ messages | length }} {{ 'abc' | count }} {{ '  t  ' | trim }} {{ 'xxhixx' | trim('x') }}"
    " {{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') "
    "}}"
    " {{ messages | rejectattr('role', 'in', ['user', 'system']) | list | length }}"
    " {{ ['a', 'b'] | join }} {{ 'Hé' | upper }} {{ 'ÀB' | lower }} {{ [3, 1] | first }}"
    " {{ [3, 1] | last }} {{ u | default('dflt') }} {{ '' | d('e', true) }} {{ 12 | string }}"
    " {{ '42' | int + 1 }} {{ '3.7' | int }} {{ 'ab' | list }} {{ 'a-b' | replace('-', '+') }}"
    " {{ '<b>' | safe }} {{ 'hello world' | capitalize }} {{ 'hello big-world(x' | title }}",
    "{{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 7 | round }} {{ -3 | abs }} {{ -2.5 | abs }}"
    " {{ [1, 2, 1, 'A', 'a'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | "
    "reverse }}"
    " {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }}"
    " {{ messages | sort(attribute='role') | map(attribute='role') | join(',') }}"
    " {{ 'one two  three' | wordcount }} {{ {'b': 1, 'a': 2} | dictsort }}"
    " {{ {'k': 1} | items | list }} {{ [1, 2, 3] | sum }} {{ [4, 2, 9] | max }}",
    "{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'x\n\ny' | indent(first=true, "
    "blank=true) }}",
    "{{ messages[2].tool_calls[0].function.arguments | tojson }}\n{{ messages[2] | tojson(indent=2)"
    " }}\n{{ {'u': 'é\"\\n', 'f': [1.0, 0.1, 1e-7, 1e20]} | tojson }}\n{{ [] | tojson(indent=4) }}",
    // operators and literals
    "{{ 1 + 2 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}"
    " {{ 2 ** -1 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 "
    "}}"
    " {{ 1e-5 }} {{ 1e16 }} {{ 123456789.0 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ not 1 == 2 }}"
    " {{ 1 if false }}{{ 'y' if 0 else 'n' }} {{ 1 and 'x' }} {{ 0 or '' or 'z' }} {{ 'b' in 'abc' "
    "}}"
    " {{ 3 not in [1, 2] }} {{ (1, 2) }} {{ (1,) }} {{ {'a': [1, 'x', none, true]} }} {{ -1 | abs "
    "}}",
    "{{ 'a\\tb\\x41\\u00e9\\\\' }}|{{ \"it's\" }}|{{ 'q\"' }}|{{ ['it\\'s', 'x'] }}|{{ True }}"
    "{{ False }}{{ None }}|{{ 1_000 }}",
    // access and slices
    "{{ messages[0]['role'] }} {{ messages[-1].content }} {{ messages[1].missing }}|"
    "{{ messages[9] }}|{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'h🎉llo'[-3:] }}"
    " {{ [1, 2, 3, 4, 5][::2] }} {{ [1, 2, 3][-2:] }} {{ messages[::-1][0].role }} {{ 'abc'[5:] }}",
    // string / dict / list methods
    "{{ '  x  '.strip() }}|{{ 'xxyxx'.lstrip('x') }}|{{ 'xxyxx'.rstrip('x') }}|{{ "
    "'a,b,,c'.split(',')"
    " }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'abc'.startswith('ab') }}"
    "{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'aaa'.replace('a', "
    "'b', 2) }}|{{ 'hello world'.title() }}|{{ 'hello'.find('l') }}{{ 'hello'.count('l') }}|"
    "{{ '-'.join(['x', 'y']) }}|{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b') }}"
    "{{ {'a': 1}.get('b', 7) }}|{{ {'a': 1, 'b': 2}.keys() | list }}{{ {'a': 1}.values() | list }}"
    "|{{ [1, 2, 2].count(2) }}{{ [1, 2].index(2) }}",
    // globals and variables
    "{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ tools }}{{ dict(a=1, b='x') }}"
    "{{ namespace(a=1).a }}{{ strftime_now('%Y') | length }}",
};

TEST(JinjaConstructs, MatchPythonJinja2) {
  if (auto why = test::oracle_unavailable(test::Oracle::kPythonJinja2)) GTEST_SKIP() << *why;
  const ordered_json messages = ordered_json::parse(kMessages);
  ordered_json cases = ordered_json::array();
  std::vector<std::string> got;
  for (const char* t : kTemplates) {
    cases.push_back({{"template", t},
                     {"context",
                      {{"messages", messages},
                       {"add_generation_prompt", true},
                       {"tools", nullptr},
                       {"bos_token", "<s>"},
                       {"eos_token", "</s>"}}}});
    try {
      got.push_back(ChatTemplate(t).render(messages, true, nullptr, "<s>", "</s>"));
    } catch (const std::exception& e) {
      got.push_back(std::string("serval error: ") + e.what());
    }
  }
  const auto want = test::run_oracle(test::Oracle::kPythonJinja2, cases);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(want[i].ok) << "template " << i << ": " << want[i].error;
    EXPECT_EQ(got[i], want[i].out) << "template " << i << ":\n" << kTemplates[i];
  }
}

void expect_load_error(const std::string& source, const std::string& construct, int line) {
  try {
    ChatTemplate t(source);
    ADD_FAILURE() << "no LoadError for " << source;
  } catch (const LoadError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(construct), std::string::npos) << msg;
    EXPECT_NE(msg.find("line " + std::to_string(line)), std::string::npos) << msg;
  }
}

TEST(JinjaConstructs, UnsupportedConstructsFailAtLoad) {
  expect_load_error("a\n{% include 'x.j2' %}", "include", 2);
  expect_load_error("\n\n{% extends 'base' %}", "extends", 3);
  expect_load_error("{% block body %}x{% endblock %}", "block", 1);
  expect_load_error("x\n{% filter upper %}x{% endfilter %}", "filter", 2);
  expect_load_error("{{ x }}\n\n\n{{ x | frobnicate }}", "frobnicate", 4);
  expect_load_error("\n{% if x is frobbable %}{% endif %}", "frobbable", 2);
  expect_load_error("{% for x in y %}\n{{ x }", "line", 2);
  expect_load_error("{% if x %}\nopen", "endif", 2);
  expect_load_error("\n{{ (1 + }}", "line", 2);
}

TEST(JinjaConstructs, RaiseExceptionCarriesMessage) {
  const ChatTemplate t(
      "{% if messages[0].role != 'user' %}\n{{ raise_exception('Conversation roles must "
      "alternate user/assistant') }}{% endif %}ok");
  const ordered_json user = ordered_json::parse(R"([{"role":"user","content":"x"}])");
  EXPECT_EQ(t.render(user, false, nullptr, "", ""), "ok");
  const ordered_json sys = ordered_json::parse(R"([{"role":"system","content":"x"}])");
  try {
    t.render(sys, false, nullptr, "", "");
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Conversation roles must alternate user/assistant"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  }
}

TEST(JinjaConstructs, RenderErrorsNameTheLine) {
  const ChatTemplate t("a\nb\n{{ 1 + 'x' }}");
  EXPECT_THROW(t.render(ordered_json::array(), false, nullptr, "", ""), InvalidArgument);
  try {
    t.render(ordered_json::array(), false, nullptr, "", "");
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace serval::tokenizer
