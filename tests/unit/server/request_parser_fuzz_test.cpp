// Structure-aware fuzzing of the request parser: valid completion, chat and Responses API bodies
// with random
// fields replaced by random JSON values (wrong types, huge and negative numbers, nested
// containers), removed or added, and random byte-level damage to serialized bodies. Whatever
// comes in, parsing must either succeed or throw an ApiError with a 4xx status: any other
// exception would reach the client as a 500 for a request that is simply malformed.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/embeddings_api.h"
#include "server/request_parser.h"
#include "server/responses_api.h"
#include "server/score_api.h"
#include "server/server.h"
#include "server_test_support.h"
#include "support/fuzz_budget.h"

namespace serval::server {
namespace {

// Every field the parser reads, and a few it does not.
const std::vector<std::string> kFields = {"model",
                                          "prompt",
                                          "messages",
                                          "max_tokens",
                                          "max_completion_tokens",
                                          "temperature",
                                          "top_p",
                                          "top_k",
                                          "min_p",
                                          "n",
                                          "stop",
                                          "stop_token_ids",
                                          "seed",
                                          "logprobs",
                                          "top_logprobs",
                                          "stream",
                                          "stream_options",
                                          "presence_penalty",
                                          "frequency_penalty",
                                          "repetition_penalty",
                                          "min_tokens",
                                          "ignore_eos",
                                          "echo",
                                          "skip_special_tokens",
                                          "add_special_tokens",
                                          "add_generation_prompt",
                                          "chat_template_kwargs",
                                          "tools",
                                          "return_tokens_as_token_ids",
                                          "logit_bias",
                                          "allowed_token_ids",
                                          "include_stop_str_in_output",
                                          "response_format",
                                          "guided_json",
                                          "guided_choice",
                                          "guided_regex",
                                          "guided_grammar",
                                          "structured_outputs",
                                          "truncate_prompt_tokens",
                                          "prompt_logprobs",
                                          "continue_final_message",
                                          "tool_choice",
                                          "best_of",
                                          "use_beam_search",
                                          "suffix",
                                          "input",
                                          "instructions",
                                          "max_output_tokens",
                                          "text",
                                          "include",
                                          "previous_response_id",
                                          "background",
                                          "parallel_tool_calls",
                                          "metadata",
                                          "store",
                                          "user",
                                          "unknown_field"};

class Fuzzer {
 public:
  explicit Fuzzer(uint32_t seed) : rng_(seed) {}

  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  // A random JSON value, containers at most `depth` deep.
  Json value(int depth) {
    switch (pick(depth > 0 ? 12 : 10)) {
      case 0:
        return nullptr;
      case 1:
        return pick(2) == 1;
      case 2:
        return pick(64) - 8;  // small ints, some negative
      case 3: {
        static const int64_t extremes[] = {std::numeric_limits<int64_t>::max(),
                                           std::numeric_limits<int64_t>::min(),
                                           int64_t(1) << 31,
                                           -(int64_t(1) << 31),
                                           int64_t(1) << 53,
                                           0};
        return extremes[pick(6)];
      }
      case 4:
        return std::numeric_limits<uint64_t>::max() - uint64_t(pick(3));
      case 5: {
        static const double doubles[] = {0.5, -0.5, 1e308, -1e308, 1e-320, 2.5, 100.0, -0.0};
        return doubles[pick(8)];
      }
      case 6:
        return text();
      case 7:
        return std::string();
      case 8:
        return Json::array();
      case 9:
        return Json::object();
      case 10: {
        Json a = Json::array();
        for (int i = pick(4); i > 0; --i) a.push_back(value(depth - 1));
        return a;
      }
      default: {
        Json o = Json::object();
        for (int i = pick(4); i > 0; --i) o[field()] = value(depth - 1);
        return o;
      }
    }
  }

  // Short strings: valid UTF-8 as parse_body guarantees (it refuses ill-formed bytes and lone
  // surrogates), with multi-byte characters, a NUL and template-like text.
  std::string text() {
    static const std::vector<std::string> words = {"hi",
                                                   "user",
                                                   "system",
                                                   "assistant",
                                                   "tool",
                                                   "text",
                                                   "content",
                                                   "role",
                                                   "\xc3\xa9",
                                                   "\xe2\x82\xac",
                                                   "\xf0\x9f\x98\x80",
                                                   std::string("\0x", 2),
                                                   "{{",
                                                   "{%",
                                                   "</s>",
                                                   "\n",
                                                   "token_id:3",
                                                   ""};
    std::string s;
    for (int i = pick(4); i >= 0; --i) s += words[size_t(pick(int(words.size())))];
    return s;
  }

  std::string field() {
    static const std::vector<std::string> inner = {
        "role",  "content", "type",    "text",      "include_usage", "continuous_usage_stats",
        "name",  "x",       "call_id", "arguments", "output",        "format",
        "schema"};
    return pick(2) ? kFields[size_t(pick(int(kFields.size())))]
                   : inner[size_t(pick(int(inner.size())))];
  }

  // 1-4 mutations of `body`: set a field to a random value, remove one, or mutate a message (or
  // an item of a Responses API input list).
  void mutate(Json& body) {
    const char* list = body.contains("input") ? "input" : "messages";
    for (int i = pick(4); i >= 0; --i) {
      const int op = pick(6);
      if (op <= 2) {
        body[kFields[size_t(pick(int(kFields.size())))]] = value(3);
      } else if (op == 3 && !body.empty()) {
        auto it = body.begin();
        std::advance(it, pick(int(body.size())));
        body.erase(it);
      } else if (body.contains(list) && body[list].is_array() && !body[list].empty()) {
        Json& messages = body[list];
        Json& m = messages[size_t(pick(int(messages.size())))];
        if (m.is_object()) {
          m[field()] = value(2);
        } else {
          m = value(2);
        }
      } else {
        body[field()] = value(3);
      }
    }
  }

  // Byte-level damage to a serialized body: flips, insertions, deletions, truncation.
  std::string damage(std::string s) {
    for (int i = pick(4); i >= 0 && !s.empty(); --i) {
      const size_t at = size_t(pick(int(s.size())));
      switch (pick(4)) {
        case 0:
          s[at] = char(pick(256));
          break;
        case 1:
          s.insert(at, 1, "{}[]\",:0-e\\"[pick(12)]);
          break;
        case 2:
          s.erase(at, 1);
          break;
        default:
          s.resize(at);
          break;
      }
    }
    return s;
  }

 private:
  std::mt19937 rng_;
};

// Bodies per fuzz test: 20000 (~0.1 s) unless SERVAL_FUZZ_ITERATIONS says otherwise.
int fuzz_iterations() {
  return serval::testing::fuzz_iterations(20000);
}
using serval::testing::fuzz_seed;

class RequestParserFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = testing::make_byte_tokenizer();
    tmpl_ = std::make_unique<tokenizer::ChatTemplate>(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}");
    info_.max_model_len = 256;
    info_.vocab_size = tok_->vocab_size();
    ctx_.info = &info_;
    ctx_.tokenizer = tok_.get();
    ctx_.chat_template = tmpl_.get();
  }

  // Parses and resolves `body`; records a failure for anything but success or a 4xx ApiError.
  // Returns whether it parsed.
  bool check(const Json& body, ApiKind kind) {
    try {
      GenerationRequest req = kind == ApiKind::kChat        ? parse_chat_request(body, ctx_)
                              : kind == ApiKind::kResponses ? parse_responses_request(body, ctx_)
                                                            : parse_completion_request(body, ctx_);
      for (const PromptInput& p : req.prompts)
        resolve_max_tokens(req, int(p.token_ids.size()), info_.max_model_len);
      return true;
    } catch (const ApiError& e) {
      EXPECT_GE(e.status(), 400) << body.dump(-1, ' ', false, Json::error_handler_t::replace);
      EXPECT_LT(e.status(), 500) << body.dump(-1, ' ', false, Json::error_handler_t::replace);
      EXPECT_FALSE(std::string(e.what()).empty());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an ApiError: " << e.what()
                    << "\nbody: " << body.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    return false;
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<tokenizer::ChatTemplate> tmpl_;
  runtime::ModelInfo info_;
  ModelContext ctx_;
};

const Json kCompletion = {
    {"model", "m"}, {"prompt", "hello there"},     {"max_tokens", 8}, {"temperature", 0.7},
    {"top_p", 0.9}, {"stop", Json::array({"\n"})}, {"logprobs", 2},   {"seed", 1}};
const Json kChat = {{"model", "m"},
                    {"messages", Json::array({Json{{"role", "system"}, {"content", "be brief"}},
                                              Json{{"role", "user"}, {"content", "hi"}}})},
                    {"max_completion_tokens", 8},
                    {"stream", true},
                    {"stream_options", Json{{"include_usage", true}}},
                    {"logprobs", true},
                    {"top_logprobs", 3}};

// Responses API bodies: a conversation with an earlier function call and its output, function
// tools, logprobs; and a text.format JSON schema.
const Json kResponsesTools = Json::parse(R"({"model": "m", "instructions": "be brief",
    "input": [{"role": "user", "content": "hi"},
              {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c1", "output": "42"},
              {"type": "reasoning", "summary": []},
              {"role": "user", "content": [{"type": "input_text", "text": "go on"}]}],
    "tools": [{"type": "function", "name": "f",
               "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}],
    "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
    "max_output_tokens": 8,
    "include": ["message.output_text.logprobs"], "top_logprobs": 2, "stream": true})");
const Json kResponsesFormat = Json::parse(R"({"model": "m", "input": "hello",
    "text": {"format": {"type": "json_schema", "name": "p",
                        "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}},
    "max_output_tokens": 16, "temperature": 0.5, "metadata": {"k": "v"}})");

// The base body of fuzz iteration i: completion, chat, and the two Responses API bodies in turn.
std::pair<Json, ApiKind> base_body(int i) {
  switch (i % 4) {
    case 0:
      return {kCompletion, ApiKind::kCompletion};
    case 1:
      return {kChat, ApiKind::kChat};
    case 2:
      return {kResponsesTools, ApiKind::kResponses};
    default:
      return {kResponsesFormat, ApiKind::kResponses};
  }
}

TEST_F(RequestParserFuzzTest, BaseBodiesParse) {
  for (int i = 0; i < 4; ++i) {
    const auto [body, kind] = base_body(i);
    EXPECT_TRUE(check(body, kind)) << body.dump();
  }
}

TEST_F(RequestParserFuzzTest, MutatedBodiesParseOrGiveA4xx) {
  Fuzzer f(fuzz_seed(20261201));
  int parsed = 0;
  const int iterations = fuzz_iterations();
  for (int i = 0; i < iterations; ++i) {
    auto [body, kind] = base_body(i);
    f.mutate(body);
    parsed += check(body, kind) ? 1 : 0;
    if (HasFailure()) return;  // the first failing body is the useful one
  }
  // The mutations must leave a fair share valid, or the fuzzer only tests the first check.
  EXPECT_GT(parsed, iterations / 20);
  EXPECT_LT(parsed, iterations);
}

// The pooling routes' bodies (--runner pooling): /v1/embeddings, /score and /rerank bodies parse,
// or give a 4xx naming what is wrong; a parsed embedding takes its dimensions, a parsed score or
// rerank pairs only texts it has.
TEST_F(RequestParserFuzzTest, MutatedPoolingBodiesParseOrGiveA4xx) {
  info_.hidden_size = 8;
  const Json embed = Json::parse(R"({"model": "m", "input": ["hello", [1, 2, 3]], "dimensions": 4,
      "encoding_format": "float", "normalize": false, "truncate_prompt_tokens": 4,
      "add_special_tokens": true})");
  const Json score = Json::parse(R"({"model": "m", "text_1": ["a b", "c"], "text_2": ["d", "e f"],
      "truncate_prompt_tokens": 3})");
  const Json rerank = Json::parse(R"({"model": "m", "query": "q", "documents": ["a", "b c", "d"],
      "top_n": 2})");
  Fuzzer f(fuzz_seed(20261207));
  int parsed = 0;
  const int iterations = fuzz_iterations() / 4;
  for (int i = 0; i < iterations && !HasFailure(); ++i) {
    Json body = i % 3 == 0 ? embed : i % 3 == 1 ? score : rerank;
    f.mutate(body);
    try {
      if (i % 3 == 0) {
        const EmbeddingRequest req = parse_embedding_request(body, ctx_);
        ASSERT_FALSE(req.prompts.empty());
        const Json e = embedding_value(req, std::vector<float>(8, 0.5f));
        if (!req.base64) EXPECT_EQ(e.size(), size_t(req.dimensions.value_or(8)));
      } else {
        const ScoreRequest req =
            i % 3 == 1 ? parse_score_request(body, ctx_) : parse_rerank_request(body, ctx_).score;
        ASSERT_FALSE(req.pairs.empty());
        for (const auto& [a, b] : req.pairs) {
          EXPECT_LT(a, req.texts.size());
          EXPECT_LT(b, req.texts.size());
        }
      }
      ++parsed;
    } catch (const ApiError& e) {
      EXPECT_GE(e.status(), 400) << body.dump(-1, ' ', false, Json::error_handler_t::replace);
      EXPECT_LT(e.status(), 500) << body.dump(-1, ' ', false, Json::error_handler_t::replace);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an ApiError: " << e.what()
                    << "\nbody: " << body.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
  }
  EXPECT_GT(parsed, iterations / 20);
  EXPECT_LT(parsed, iterations);
}

TEST_F(RequestParserFuzzTest, DamagedBytesGiveA4xx) {
  Fuzzer f(fuzz_seed(7));
  const int iterations = fuzz_iterations();
  for (int i = 0; i < iterations; ++i) {
    auto [base, kind] = base_body(i);
    if (i % 3 == 0) f.mutate(base);
    const std::string bytes = f.damage(base.dump());
    try {
      check(parse_body(bytes), kind);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << bytes;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an ApiError: " << e.what() << "\nbytes: " << bytes;
    }
    if (HasFailure()) return;
  }
}

TEST_F(RequestParserFuzzTest, DeepNestingIsRefusedBeforeParsing) {
  for (const char* open : {"[", "{\"a\":"}) {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += open;
    try {
      parse_body(s);
      ADD_FAILURE() << "accepted " << open << " x 100000";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
    }
  }
}

// The whole server (real sockets, FakeEngine) under mutated and damaged bodies on every JSON
// endpoint: never a 500 (503 only for overload), and still healthy afterwards. This reaches what
// the parser accepts: generation with odd sampling, logprobs, stop and streaming combinations,
// Responses API replies and events, tokenize, detokenize.
TEST(ServerFuzz, MutatedRequestsNeverGiveA500) {
  testing::FakeEngine engine;
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.max_logprobs = 5;
  Server server(engine, o);
  const int port = server.start();
  Fuzzer f(fuzz_seed(4242));
  Json completion = kCompletion, chat = kChat, responses = kResponsesTools,
       responses_format = kResponsesFormat;
  completion["model"] = chat["model"] = responses["model"] = responses_format["model"] =
      "fake-model";
  const Json tokenize = {{"model", "fake-model"}, {"prompt", "hello"}};
  const Json detokenize = {{"model", "fake-model"}, {"tokens", Json::array({104, 105})}};
  const int iterations = serval::testing::fuzz_iterations(600);
  for (int i = 0; i < iterations; ++i) {
    static const char* paths[] = {"/v1/completions", "/v1/chat/completions", "/tokenize",
                                  "/detokenize", "/v1/responses"};
    const int which = f.pick(5);
    const Json* bases[] = {&completion, &chat, &tokenize, &detokenize,
                           f.pick(2) ? &responses : &responses_format};
    Json body = *bases[which];
    if (which == 2 && f.pick(2)) body = chat;  // /tokenize takes messages too
    f.mutate(body);
    const std::string text = f.pick(5) == 0 ? f.damage(body.dump()) : body.dump();
    const testing::HttpResult r = testing::http(port, "POST", paths[which], text);
    ASSERT_NE(r.status, 500) << paths[which] << " " << text << "\n" << r.body;
    // 503: a request for more sequences (n) than the fake engine's queue holds.
    ASSERT_TRUE(r.status == 200 || r.status == 503 || (r.status >= 400 && r.status < 500))
        << r.status << " " << paths[which] << " " << text;
  }
  EXPECT_EQ(testing::http(port, "GET", "/health").status, 200);
  server.shutdown(1.0);
  engine.shutdown();
}

}  // namespace
}  // namespace serval::server
