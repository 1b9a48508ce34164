// The `serval serve` command line: vLLM spellings, ignored flags, suggestions, mapping.
#include "server/serve_args.h"

#include <gtest/gtest.h>

namespace serval::server {
namespace {

TEST(ServeArgs, MapsFlagsInBothSpellings) {
  ServeArgs a = parse_serve_args({"/models/q",
                                  "--port=9001",
                                  "--max_model_len",
                                  "2048",
                                  "--max-num-seqs",
                                  "8",
                                  "--served_model_name",
                                  "q",
                                  "--api-key",
                                  "k",
                                  "--kv_cache_dtype=fp8",
                                  "--seed",
                                  "7",
                                  "--no-enable-prefix-caching",
                                  "--enforce_eager",
                                  "-tp",
                                  "2",
                                  "--max-logprobs",
                                  "5",
                                  "--device",
                                  "cpu",
                                  "--load-format",
                                  "dummy"},
                                 nullptr);
  EXPECT_EQ(a.engine.model_dir, "/models/q");
  EXPECT_EQ(a.server.port, 9001);
  EXPECT_EQ(a.engine.max_model_len, 2048);
  EXPECT_EQ(a.engine.max_num_seqs, 8);
  EXPECT_EQ(a.engine.served_model_name, "q");
  EXPECT_EQ(a.server.served_model_names, std::vector<std::string>{"q"});
  EXPECT_EQ(a.server.api_key, "k");
  EXPECT_EQ(a.engine.kv_cache_dtype, "fp8");
  EXPECT_EQ(a.engine.seed, 7u);
  EXPECT_FALSE(a.engine.enable_prefix_caching);
  EXPECT_TRUE(a.engine.enforce_eager);
  EXPECT_EQ(a.engine.tensor_parallel_size, 2);
  EXPECT_EQ(a.server.max_logprobs, 5);
  EXPECT_EQ(a.engine.max_logprobs, 5);
  EXPECT_EQ(a.engine.device, "cpu");
  EXPECT_EQ(a.engine.load_format, "dummy");
  EXPECT_TRUE(a.ignored.empty());
}

TEST(ServeArgs, ChatTemplateIsPassedToTheEngine) {
  ServeArgs a = parse_serve_args({"/m", "--chat-template", "/t/chat.jinja"}, nullptr);
  EXPECT_EQ(a.engine.chat_template, "/t/chat.jinja");
  a = parse_serve_args({"/m", "--chat_template={{ messages }}"}, nullptr);
  EXPECT_EQ(a.engine.chat_template, "{{ messages }}");
  EXPECT_TRUE(parse_serve_args({"/m"}, nullptr).engine.chat_template.empty());
}

TEST(ServeArgs, ModelFlagAndDefaults) {
  ServeArgs a = parse_serve_args({"--model", "/m"}, nullptr);
  EXPECT_EQ(a.engine.model_dir, "/m");
  EXPECT_EQ(a.server.port, 8000);
  EXPECT_TRUE(a.engine.enable_prefix_caching);
  EXPECT_EQ(a.engine.moe_backend, "latency");
  EXPECT_THROW(parse_serve_args({"--port", "1"}, nullptr), InvalidArgument);  // no model
}

// vLLM's tool-calling flags: the parser is required with --enable-auto-tool-choice (without the
// flag a parser alone turns nothing on); hermes, llama3_json and pythonic are known.
TEST(ServeArgs, AutoToolChoiceNeedsAKnownParser) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).server.tool_call_parser, ToolCallParser::kNone);
  const std::pair<const char*, ToolCallParser> known[] = {
      {"hermes", ToolCallParser::kHermes},
      {"llama3_json", ToolCallParser::kLlama3Json},
      {"pythonic", ToolCallParser::kPythonic},
      {"mistral", ToolCallParser::kMistral}};
  for (const auto& [name, parser] : known) {
    EXPECT_EQ(
        parse_serve_args({"/m", "--enable-auto-tool-choice", "--tool-call-parser", name}, nullptr)
            .server.tool_call_parser,
        parser)
        << name;
    EXPECT_EQ(parse_serve_args({"/m", "--tool-call-parser", name}, nullptr).server.tool_call_parser,
              ToolCallParser::kNone)
        << name;
  }
  EXPECT_THROW(parse_serve_args({"/m", "--enable-auto-tool-choice"}, nullptr), InvalidArgument);
  try {
    parse_serve_args({"/m", "--enable-auto-tool-choice", "--tool-call-parser", "granite"}, nullptr);
    ADD_FAILURE() << "accepted an unknown parser";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("choices: hermes, llama3_json, pythonic, mistral"),
              std::string::npos)
        << e.what();
  }
}

TEST(ServeArgs, GenerationConfigFlags) {
  const ServeArgs a = parse_serve_args(
      {"/m", "--generation-config", "vllm", "--override-generation-config", R"({"top_k": 20})"},
      nullptr);
  EXPECT_EQ(a.engine.generation_config, "vllm");
  EXPECT_EQ(a.engine.override_generation_config, R"({"top_k": 20})");
}

TEST(ServeArgs, UsageAndTokenIdFlags) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).server.response_role, "assistant");
  EXPECT_EQ(parse_serve_args({"/m", "--response-role", "bot"}, nullptr).server.response_role,
            "bot");
  EXPECT_FALSE(parse_serve_args({"/m"}, nullptr).server.force_include_usage);
  EXPECT_TRUE(
      parse_serve_args({"/m", "--enable-force-include-usage"}, nullptr).server.force_include_usage);
  EXPECT_FALSE(parse_serve_args({"/m"}, nullptr).server.return_tokens_as_token_ids);
  EXPECT_TRUE(parse_serve_args({"/m", "--return-tokens-as-token-ids"}, nullptr)
                  .server.return_tokens_as_token_ids);
}

// vLLM's CORS flags: JSON lists, every origin, method and header by default.
TEST(ServeArgs, CorsFlags) {
  const ServeArgs d = parse_serve_args({"/m"}, nullptr);
  EXPECT_EQ(d.server.cors.origins, std::vector<std::string>{"*"});
  EXPECT_EQ(d.server.cors.methods, std::vector<std::string>{"*"});
  EXPECT_EQ(d.server.cors.headers, std::vector<std::string>{"*"});
  EXPECT_FALSE(d.server.cors.credentials);
  const ServeArgs a = parse_serve_args(
      {"/m", "--allowed-origins", R"(["https://a.example", "http://localhost:3000"])",
       "--allowed-methods", R"(["GET", "POST"])", "--allowed-headers", "[]", "--allow-credentials"},
      nullptr);
  EXPECT_EQ(a.server.cors.origins,
            (std::vector<std::string>{"https://a.example", "http://localhost:3000"}));
  EXPECT_EQ(a.server.cors.methods, (std::vector<std::string>{"GET", "POST"}));
  EXPECT_TRUE(a.server.cors.headers.empty());
  EXPECT_TRUE(a.server.cors.credentials);
  for (const char* bad : {"*", "[1]", "{\"a\": 1}", "[\"a\""}) {
    try {
      parse_serve_args({"/m", "--allowed-origins", bad}, nullptr);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--allowed-origins: expected a JSON list"),
                std::string::npos)
          << e.what();
    }
  }
}

// vLLM's --reasoning-parser: deepseek_r1 and qwen3 are known; another name lists the choices.
// --runner pooling (and vLLM's older --task embed, --convert embed) serve an embedding model;
// contradicting values are refused.
TEST(ServeArgs, RunnerPooling) {
  EXPECT_FALSE(parse_serve_args({"/m"}, nullptr).engine.pooling);
  EXPECT_TRUE(parse_serve_args({"/m", "--runner", "pooling"}, nullptr).engine.pooling);
  EXPECT_TRUE(parse_serve_args({"/m", "--task", "embed"}, nullptr).engine.pooling);
  EXPECT_TRUE(parse_serve_args({"/m", "--convert", "embed"}, nullptr).engine.pooling);
  EXPECT_FALSE(parse_serve_args({"/m", "--runner", "generate"}, nullptr).engine.pooling);
  EXPECT_THROW(parse_serve_args({"/m", "--runner", "generate", "--task", "embed"}, nullptr),
               InvalidArgument);
  EXPECT_ANY_THROW(parse_serve_args({"/m", "--runner", "classify"}, nullptr));
  // --pooler-config: LAST pooling only; normalize sets the requests' default.
  EXPECT_TRUE(parse_serve_args({"/m", "--runner", "pooling"}, nullptr).server.embed_normalize);
  EXPECT_FALSE(parse_serve_args({"/m", "--runner", "pooling", "--pooler-config",
                                 R"({"pooling_type": "LAST", "normalize": false})"},
                                nullptr)
                   .server.embed_normalize);
  for (const char* bad :
       {R"({"pooling_type": "MEAN"})", R"({"softmax": true})", "[1]", R"({"normalize": 1})"})
    EXPECT_THROW(parse_serve_args({"/m", "--pooler-config", bad}, nullptr), InvalidArgument) << bad;
}

TEST(ServeArgs, ReasoningParser) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).server.reasoning_parser, ReasoningParser::kNone);
  // Older vLLM command lines: --enable-reasoning beside the parser, a guided decoding backend.
  const ServeArgs old = parse_serve_args({"/m", "--enable-reasoning", "--reasoning-parser",
                                          "deepseek_r1", "--guided-decoding-backend", "xgrammar"},
                                         nullptr);
  EXPECT_EQ(old.server.reasoning_parser, ReasoningParser::kDeepSeekR1);
  EXPECT_EQ(old.ignored.size(), 2u);
  EXPECT_EQ(
      parse_serve_args({"/m", "--reasoning-parser", "qwen3"}, nullptr).server.reasoning_parser,
      ReasoningParser::kQwen3);
  EXPECT_EQ(
      parse_serve_args({"/m", "--reasoning_parser=deepseek_r1"}, nullptr).server.reasoning_parser,
      ReasoningParser::kDeepSeekR1);
  try {
    parse_serve_args({"/m", "--reasoning-parser", "granite"}, nullptr);
    ADD_FAILURE() << "accepted an unknown reasoning parser";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("choices: deepseek_r1, deepseek_v3, mistral, qwen3"),
              std::string::npos)
        << e.what();
  }
}

// vLLM's --quantization / -q: a known format name is kept for the load to check against the
// checkpoint; others are refused at once.
TEST(ServeArgs, PromptTokensDetailsFlag) {
  EXPECT_FALSE(parse_serve_args({"/m"}, nullptr).server.prompt_tokens_details);
  EXPECT_TRUE(parse_serve_args({"/m", "--enable-prompt-tokens-details"}, nullptr)
                  .server.prompt_tokens_details);
}

TEST(ServeArgs, TokenizerFlag) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).engine.tokenizer, "");
  EXPECT_EQ(parse_serve_args({"/m", "--tokenizer", "/t"}, nullptr).engine.tokenizer, "/t");
}

TEST(ServeArgs, QuantizationFlag) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).engine.quantization, "");
  EXPECT_EQ(parse_serve_args({"/m", "--quantization", "modelopt_fp4"}, nullptr).engine.quantization,
            "modelopt_fp4");
  EXPECT_EQ(parse_serve_args({"/m", "-q", "compressed-tensors"}, nullptr).engine.quantization,
            "compressed-tensors");
  EXPECT_THROW(parse_serve_args({"/m", "--quantization", "awq"}, nullptr), InvalidArgument);
}

// On by default as in vLLM; --no-async-scheduling turns it off, --async-scheduling is accepted.
TEST(ServeArgs, AsyncSchedulingDefaultAndSwitches) {
  EXPECT_TRUE(parse_serve_args({"/m"}, nullptr).engine.async_scheduling);
  EXPECT_TRUE(parse_serve_args({"/m", "--async-scheduling"}, nullptr).engine.async_scheduling);
  const ServeArgs off = parse_serve_args({"/m", "--no-async-scheduling"}, nullptr);
  EXPECT_FALSE(off.engine.async_scheduling);
  EXPECT_TRUE(off.ignored.empty());
}

// The API key from --api-key, else VLLM_API_KEY (as vLLM), else none.
TEST(ServeArgs, ApiKeyFromTheFlagOrTheEnvironment) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).server.api_key, "");
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr, "env-key").server.api_key, "env-key");
  EXPECT_EQ(parse_serve_args({"/m", "--api-key", "flag-key"}, nullptr, "env-key").server.api_key,
            "flag-key");
}

TEST(ServeArgs, ChatTemplateContentFormat) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).server.content_format, ContentFormat::kAuto);
  EXPECT_EQ(parse_serve_args({"/m", "--chat-template-content-format", "openai"}, nullptr)
                .server.content_format,
            ContentFormat::kOpenAi);
  EXPECT_EQ(parse_serve_args({"/m", "--chat-template-content-format", "string"}, nullptr)
                .server.content_format,
            ContentFormat::kString);
  EXPECT_THROW(parse_serve_args({"/m", "--chat-template-content-format", "xml"}, nullptr),
               InvalidArgument);
}

TEST(ServeArgs, UnixDomainSocket) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).server.uds, "");
  EXPECT_EQ(parse_serve_args({"/m", "--uds", "/tmp/s.sock"}, nullptr).server.uds, "/tmp/s.sock");
}

TEST(ServeArgs, RequestIdHeadersFlag) {
  EXPECT_FALSE(parse_serve_args({"/m"}, nullptr).server.request_id_headers);
  EXPECT_TRUE(
      parse_serve_args({"/m", "--enable-request-id-headers"}, nullptr).server.request_id_headers);
}

TEST(ServeArgs, HfOverrides) {
  EXPECT_EQ(parse_serve_args({"/m", "--hf-overrides", R"({"a": 1})"}, nullptr).engine.hf_overrides,
            R"({"a": 1})");
  EXPECT_THROW(parse_serve_args({"/m", "--hf-overrides", "[1]"}, nullptr), InvalidArgument);
}

TEST(ServeArgs, SchedulingPolicy) {
  const ServeArgs fcfs = parse_serve_args({"/m"}, nullptr);
  EXPECT_FALSE(fcfs.engine.priority_scheduling);
  EXPECT_FALSE(fcfs.server.priority_scheduling);
  const ServeArgs prio = parse_serve_args({"/m", "--scheduling-policy", "priority"}, nullptr);
  EXPECT_TRUE(prio.engine.priority_scheduling);
  EXPECT_TRUE(prio.server.priority_scheduling);
  EXPECT_THROW(parse_serve_args({"/m", "--scheduling-policy", "lifo"}, nullptr), InvalidArgument);
}

TEST(ServeArgs, IgnoredVllmFlagsAreListed) {
  ServeArgs a = parse_serve_args(
      {"/m", "--swap-space", "4", "--trust-remote-code", "--pipeline-parallel-size=1",
       "--disable_log_requests", "--tokenizer-mode", "auto", "--enable-chunked-prefill"},
      nullptr);
  ASSERT_EQ(a.ignored.size(), 6u);
  EXPECT_NE(a.ignored[0].find("--swap-space"), std::string::npos);
  EXPECT_NE(a.ignored[3].find("--disable-log-requests"), std::string::npos);
  EXPECT_EQ(a.engine.model_dir, "/m");  // "4" and "auto" were consumed as values
  EXPECT_THROW(parse_serve_args({"/m", "--pipeline-parallel-size", "2"}, nullptr), InvalidArgument);
  // Deployment scripts' logging, docs and revision flags.
  const ServeArgs d = parse_serve_args({"/m", "--max-log-len", "100", "--disable-fastapi-docs",
                                        "--root-path", "/api", "--revision", "main"},
                                       nullptr);
  EXPECT_EQ(d.ignored.size(), 4u);
  EXPECT_EQ(d.engine.model_dir, "/m");
}

TEST(ServeArgs, UnknownFlagSuggestsNearest) {
  try {
    parse_serve_args({"/m", "--max-model-lenn", "5"}, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean '--max-model-len'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(nearest_flag("--gpu-memory-utilisation"), "--gpu-memory-utilization");
}

TEST(ServeArgs, CompilationConfigForms) {
  EXPECT_EQ(parse_serve_args({"/m", "--compilation-config.cudagraph_mode", "PIECEWISE"}, nullptr)
                .engine.cudagraph_mode,
            "PIECEWISE");
  EXPECT_EQ(parse_serve_args({"/m", "--compilation_config.cudagraph_mode=FULL"}, nullptr)
                .engine.cudagraph_mode,
            "FULL");
  ServeArgs j = parse_serve_args(
      {"/m", "--compilation-config", R"({"cudagraph_mode":"NONE","level":3})"}, nullptr);
  EXPECT_EQ(j.engine.cudagraph_mode, "NONE");
  ASSERT_EQ(j.ignored.size(), 1u);
  EXPECT_NE(j.ignored[0].find("level"), std::string::npos);
  EXPECT_THROW(parse_serve_args({"/m", "--compilation-config.cudagraph_mode", "BAD"}, nullptr),
               InvalidArgument);
}

TEST(ServeArgs, MoeBackendFlagEnvAndValidation) {
  EXPECT_EQ(parse_serve_args({"/m", "--moe-backend", "throughput"}, nullptr).engine.moe_backend,
            "throughput");
  EXPECT_EQ(parse_serve_args({"/m"}, "throughput").engine.moe_backend, "throughput");
  EXPECT_EQ(parse_serve_args({"/m", "--moe_backend=latency"}, "throughput").engine.moe_backend,
            "latency");
  try {
    parse_serve_args({"/m", "--moe-backend", "fast"}, nullptr);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("latency, throughput"), std::string::npos);
  }
  EXPECT_THROW(parse_serve_args({"/m"}, "bogus"), InvalidArgument);
}

// Numeric flags out of range are refused before anything loads (--block-size 0 used to divide
// by zero at engine start; --gpu-memory-utilization 2 was taken as given).
TEST(ServeArgs, NumericRangesAreChecked) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--block-size", "0"}, "--block-size must be >= 1, got 0"},
      {{"--max-model-len", "-5"}, "--max-model-len must be >= 0"},
      {{"--max-num-seqs", "0"}, "--max-num-seqs must be >= 1"},
      {{"--max-num-batched-tokens", "-1"}, "--max-num-batched-tokens must be >= 0"},
      {{"--max-waiting-requests", "0"}, "--max-waiting-requests must be >= 1"},
      {{"--kv-cache-memory-bytes", "-5"}, "--kv-cache-memory-bytes must be >= 0"},
      {{"--tensor-parallel-size", "0"}, "--tensor-parallel-size must be >= 1"},
      {{"--data-parallel-size", "0"}, "--data-parallel-size must be >= 1, got 0"},
      {{"--nnodes", "0"}, "--nnodes must be >= 1, got 0"},
      {{"--http-threads", "0"}, "--http-threads must be >= 1"},
      {{"--gpu-memory-utilization", "2"}, "--gpu-memory-utilization must be in (0, 1], got 2"},
      {{"--gpu-memory-utilization", "0"}, "--gpu-memory-utilization must be in (0, 1]"},
  };
  for (const auto& [flags, needle] : bad) {
    std::vector<std::string> args = {"/m"};
    args.insert(args.end(), flags.begin(), flags.end());
    try {
      parse_serve_args(args, nullptr);
      ADD_FAILURE() << "accepted " << flags[0] << " " << flags[1];
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  // The edges are accepted.
  const ServeArgs ok = parse_serve_args({"/m", "--block-size", "1", "--max-model-len", "0",
                                         "--gpu-memory-utilization", "1", "--nnodes", "1"},
                                        nullptr);
  EXPECT_EQ(ok.engine.block_size, 1);
  EXPECT_FLOAT_EQ(ok.engine.gpu_memory_utilization, 1.0f);
}

TEST(ServeArgs, HelpIsNotAnError) {
  ServeArgs a = parse_serve_args({"--help"}, nullptr);
  EXPECT_TRUE(a.help);
  EXPECT_NE(a.help_text.find("--max-model-len"), std::string::npos);
}

}  // namespace
}  // namespace serval::server
