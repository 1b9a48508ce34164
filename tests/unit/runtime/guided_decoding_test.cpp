// Guided decoding through the engine (CPU, the tiny Qwen3-MoE fixture, whose random weights
// would never write JSON on their own): greedy and sampled outputs are JSON of the schema and end
// with EOS; a request without the model's tokenizer is refused.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "base/error.h"
#include "runtime/engine.h"
#include "support/engine_batch.h"
#include "support/weights_only_folder.h"
#include "tokenizer/tokenizer.h"

namespace serval::runtime {
namespace {

struct Finished {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kAbort;
  std::optional<int32_t> stop_token;
};

std::vector<Finished> run(Engine& engine, const std::vector<SamplingParams>& params) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Finished> out(params.size());
  size_t done = 0;
  const std::vector<int32_t> prompt = engine.tokenizer()->encode("Answer in JSON:", false);
  for (size_t i = 0; i < params.size(); ++i)
    engine.submit(prompt, params[i], [&, i](const RequestOutput& o) {
      std::lock_guard lock(mu);
      out[i].tokens.insert(out[i].tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finish) {
        out[i].finish = *o.finish;
        out[i].stop_token = o.stop_token_id;
        ++done;
        cv.notify_all();
      }
    });
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == params.size(); }));
  return out;
}

// Room for the blanks a random model puts between tokens (up to kMaxWhitespaceRun per gap).
EngineConfig roomy_config() {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  cfg.max_model_len = 512;
  return cfg;
}

TEST(GuidedDecoding, OutputsFollowTheSchemaAndEnd) {
  auto engine = Engine::create(roomy_config());
  const auto grammar = json_schema_grammar(R"({"type": "object", "properties": {
      "color": {"enum": ["red", "green", "blue"]},
      "name": {"type": "string", "minLength": 2, "maxLength": 5},
      "age": {"type": "integer", "minimum": 18, "maximum": 99}},
      "required": ["color", "name", "age"]})");
  std::vector<SamplingParams> params;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p;
    p.temperature = i == 0 ? 0.0f : 1.0f;
    p.seed = uint64_t(i);
    p.max_tokens = 400;
    p.json_grammar = grammar;
    params.push_back(p);
  }
  const std::vector<Finished> results = run(*engine, params);
  const auto& eos = engine->info().eos_token_ids;
  for (const Finished& r : results) {
    ASSERT_EQ(r.finish, FinishReason::kStop)
        << r.tokens.size()
        << " tokens: " << nlohmann::json(engine->tokenizer()->decode(r.tokens, true)).dump();
    ASSERT_TRUE(r.stop_token.has_value());
    EXPECT_NE(std::find(eos.begin(), eos.end(), *r.stop_token), eos.end());
    const std::string text = engine->tokenizer()->decode(r.tokens, true);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    const std::string color = j["color"].get<std::string>();
    EXPECT_TRUE(color == "red" || color == "green" || color == "blue") << text;
    size_t name_length = 0;  // code points
    for (unsigned char c : j["name"].get<std::string>()) name_length += (c & 0xC0) != 0x80;
    EXPECT_TRUE(name_length >= 2 && name_length <= 5) << text;
    EXPECT_TRUE(j["age"].is_number_integer() && j["age"] >= 18 && j["age"] <= 99) << text;
    EXPECT_EQ(j.size(), 3u) << text;
  }
  engine->shutdown();
}

// disable_any_whitespace: outputs are JSON of the schema without a blank outside strings.
TEST(GuidedDecoding, CompactJsonOutputsHaveNoBlanks) {
  auto engine = Engine::create(roomy_config());
  std::vector<SamplingParams> params(3);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].temperature = i == 0 ? 0.0f : 1.0f;
    params[i].seed = 90 + i;
    params[i].max_tokens = 200;
    params[i].json_grammar = json_schema_grammar(R"({"type": "object", "properties": {
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
        "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["tags", "n"]})");
    params[i].guided_compact_json = true;
  }
  for (const Finished& r : run(*engine, params)) {
    const std::string text = engine->tokenizer()->decode(r.tokens, true);
    EXPECT_EQ(r.finish, FinishReason::kStop) << text;
    EXPECT_FALSE(nlohmann::json::parse(text, nullptr, false).is_discarded()) << text;
    bool in_string = false, escaped = false;
    for (char c : text) {
      if (in_string) {
        in_string = escaped || c != '"';
        escaped = !escaped && c == '\\';
      } else {
        EXPECT_FALSE(c == ' ' || c == '\n' || c == '\t' || c == '\r') << text;
        in_string = c == '"';
      }
    }
  }
  engine->shutdown();
}

// json_object: any object; the request stops with EOS at the closing brace or at max_tokens,
// and whatever came out is a prefix the matcher allowed (here: parses when it stopped).
TEST(GuidedDecoding, JsonObjectOutputsParseWhenTheyEnd) {
  auto engine = Engine::create(roomy_config());
  std::vector<SamplingParams> params(4);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].temperature = 0.8f;
    params[i].seed = 100 + i;
    params[i].max_tokens = 120;
    params[i].json_grammar = json_object_grammar();
  }
  int ended = 0;
  for (const Finished& r : run(*engine, params)) {
    const std::string text = engine->tokenizer()->decode(r.tokens, true);
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.find_first_not_of(" \n\r\t"), text.find('{')) << text;
    if (r.finish != FinishReason::kStop) continue;
    ++ended;
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    EXPECT_TRUE(j.is_object()) << text;
  }
  engine->shutdown();
}

TEST(GuidedDecoding, ChoicesAreTheWholeOutput) {
  auto engine = Engine::create(roomy_config());
  const std::vector<std::string> choices = {"positive", "negative", "neutral"};
  std::vector<SamplingParams> params(5);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].temperature = i == 0 ? 0.0f : 1.0f;
    params[i].seed = i;
    params[i].max_tokens = 50;
    params[i].json_grammar = choice_grammar(choices);
  }
  for (const Finished& r : run(*engine, params)) {
    const std::string text = engine->tokenizer()->decode(r.tokens, true);
    EXPECT_EQ(r.finish, FinishReason::kStop) << text;
    EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << text;
  }
  engine->shutdown();
}

// Four requests under `grammar`: one greedy, three sampled from seed0 on; each must stop (EOS)
// with a text the oracle matches.
void expect_outputs_match(const std::shared_ptr<const JsonGrammar>& grammar,
                          const std::regex& oracle, uint64_t seed0, int max_tokens) {
  auto engine = Engine::create(roomy_config());
  std::vector<SamplingParams> params(4);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].temperature = i == 0 ? 0.0f : 1.0f;
    params[i].seed = seed0 + i;
    params[i].max_tokens = max_tokens;
    params[i].json_grammar = grammar;
  }
  for (const Finished& r : run(*engine, params)) {
    const std::string text = engine->tokenizer()->decode(r.tokens, true);
    EXPECT_EQ(r.finish, FinishReason::kStop) << text;
    EXPECT_TRUE(std::regex_match(text, oracle)) << text;
  }
  engine->shutdown();
}

TEST(GuidedDecoding, RegexOutputsMatch) {
  const char* pattern = "\\d{3}-[a-z]{2}(x|yz)?";
  expect_outputs_match(regex_grammar(pattern), std::regex(pattern), 40, 40);
}

// guided_grammar: every output is a sentence of the grammar (checked by an std::regex of the
// same language) and ends there.
TEST(GuidedDecoding, GrammarOutputsAreSentences) {
  const char* grammar = R"g(root ::= item ("," item){0,2} "."
item ::= [a-z]{1,4} | "(" [0-9]+ ")")g";
  const std::regex oracle("([a-z]{1,4}|\\([0-9]+\\))(,([a-z]{1,4}|\\([0-9]+\\))){0,2}\\.");
  expect_outputs_match(gbnf_grammar(grammar), oracle, 70, 60);
}

TEST(GuidedDecoding, NeedsATokenizer) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  serval::testing::WeightsOnlyFolder weights(cfg.model_dir);
  cfg.model_dir = weights.path();
  auto engine = Engine::create(cfg);
  SamplingParams p;
  p.json_grammar = json_object_grammar();
  try {
    engine->submit({1, 2, 3}, p, [](const RequestOutput&) {});
    ADD_FAILURE() << "guided request accepted without a tokenizer";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer"), std::string::npos) << e.what();
  }
  engine->shutdown();
}

}  // namespace
}  // namespace serval::runtime
