// `serval serve` flags: a vLLM-shaped pre-processor in front of CLI11.
#include "server/serve_args.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "base/error.h"
#include "dist/launch.h"
#include "quant/quant_config.h"
#include "server/config_file.h"

namespace serval::server {
namespace {

struct KnownFlag {
  const char* name;
  bool takes_value;
};
constexpr KnownFlag kKnown[] = {
    {"--host", true},
    {"--port", true},
    {"--uds", true},
    {"--model", true},
    {"--tokenizer", true},
    {"--served-model-name", true},
    {"--dtype", true},
    {"--max-model-len", true},
    {"--max-num-seqs", true},
    {"--max-num-batched-tokens", true},
    {"--gpu-memory-utilization", true},
    {"--kv-cache-dtype", true},
    {"--kv-cache-memory-bytes", true},
    {"--block-size", true},
    {"--tensor-parallel-size", true},
    {"--data-parallel-size", true},
    {"--enable-expert-parallel", false},
    {"--nnodes", true},
    {"--node-rank", true},
    {"--dist-init-addr", true},
    {"--dist-timeout", true},
    {"--enable-prefix-caching", false},
    {"--no-enable-prefix-caching", false},
    {"--moe-backend", true},
    {"--load-format", true},
    {"--quantization", true},
    {"--seed", true},
    {"--api-key", true},
    {"--generation-config", true},
    {"--override-generation-config", true},
    {"--hf-overrides", true},
    {"--chat-template", true},
    {"--chat-template-content-format", true},
    {"--max-logprobs", true},
    {"--enable-auto-tool-choice", false},
    {"--tool-call-parser", true},
    {"--reasoning-parser", true},
    {"--enable-prompt-tokens-details", false},
    {"--device", true},
    {"--enforce-eager", false},
    {"--nvfp4-activations", false},
    {"--async-scheduling", false},
    {"--no-async-scheduling", false},
    {"--compilation-config", true},
    {"--speculative-config", true},
    {"--cudagraph-mode", true},
    {"--max-waiting-requests", true},
    {"--scheduling-policy", true},
    {"--runner", true},
    {"--pooler-config", true},
    {"--task", true},
    {"--convert", true},
    {"--http-threads", true},
    {"--allowed-origins", true},
    {"--allowed-methods", true},
    {"--allowed-headers", true},
    {"--allow-credentials", false},
    {"--enable-request-id-headers", false},
    {"--return-tokens-as-token-ids", false},
    {"--enable-force-include-usage", false},
    {"--response-role", true},
    {"--help", false},
    {"--config", true},  // read before the others (with_config_file); here for suggestions
};

// vLLM flags that have no meaning in serval: accepted, reported once at start-up.
struct IgnoredFlag {
  const char* name;
  bool takes_value;
  const char* reason;
};
constexpr IgnoredFlag kIgnored[] = {
    {"--swap-space", true, "preemption recomputes, nothing is swapped to CPU"},
    {"--trust-remote-code", false, "serval runs no model code from the model folder"},
    {"--pipeline-parallel-size", true, "no pipeline parallelism; must be 1"},
    {"--disable-log-requests", false, "requests are not logged"},
    {"--enable-log-requests", false, "requests are not logged"},
    {"--disable-log-stats", false, "stats are on /metrics"},
    {"--tokenizer-mode", true, "tokenizer.json is always used"},
    {"--enable-chunked-prefill", false, "chunked prefill is always on"},
    {"--no-enable-chunked-prefill", false, "chunked prefill is always on"},
    {"--disable-uvicorn-access-log", false, "there is no uvicorn"},
    {"--uvicorn-log-level", true, "there is no uvicorn"},
    {"--distributed-executor-backend", true, "one process with one thread per GPU"},
    {"--max-seq-len-to-capture", true, "CUDA graphs cover decode batches only"},
    {"--disable-custom-all-reduce", false, "NCCL does every all-reduce"},
    {"--download-dir", true, "models are local folders"},
    {"--disable-frontend-multiprocessing", false, "the server is one process"},
    {"--guided-decoding-backend", true, "serval has one guided decoding backend"},
    {"--enable-reasoning", false, "reasoning is split whenever --reasoning-parser is given"},
    {"--max-log-len", true, "requests are not logged"},
    {"--disable-fastapi-docs", false, "there are no API docs pages"},
    {"--root-path", true, "routes are served at their own paths (a proxy strips its prefix)"},
    {"--revision", true, "models are local folders"},
    {"--tokenizer-revision", true, "models are local folders"},
    {"--code-revision", true, "models are local folders"},
};

// --pooler-config: a JSON object of vLLM's pooler settings that serval has; returns `normalize`.
bool parse_pooler_config(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw InvalidArgument("--pooler-config must be a JSON object, got: " + text);
  bool normalize = true;
  for (const auto& [key, value] : j.items()) {
    if (key == "pooling_type") {
      if (!value.is_string() || (value != "LAST" && value != "last"))
        throw InvalidArgument("--pooler-config pooling_type " + value.dump() +
                              ": serval pools the last token only (LAST)");
    } else if (key == "normalize") {
      if (!value.is_boolean()) throw InvalidArgument("--pooler-config normalize must be a boolean");
      normalize = value.get<bool>();
    } else {
      throw InvalidArgument("--pooler-config: '" + key +
                            "' is not supported (serval has pooling_type LAST and normalize)");
    }
  }
  return normalize;
}

constexpr const char* kCudagraphModes[] = {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY",
                                           "FULL_AND_PIECEWISE"};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const KnownFlag* find_known(std::string_view name) {
  for (const auto& f : kKnown)
    if (name == f.name) return &f;
  return nullptr;
}

const IgnoredFlag* find_ignored(std::string_view name) {
  for (const auto& f : kIgnored)
    if (name == f.name) return &f;
  return nullptr;
}

std::string check_cudagraph_mode(const std::string& mode) {
  for (const char* m : kCudagraphModes)
    if (mode == m) return mode;
  throw InvalidArgument(
      fmt::format("compilation_config.cudagraph_mode: invalid value '{}'; choose one of: {}", mode,
                  fmt::join(kCudagraphModes, ", ")));
}

// A JSON list of strings, as vLLM's --allowed-origins/-methods/-headers take.
std::vector<std::string> json_string_list(const char* flag, const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_array() ||
      !std::all_of(j.begin(), j.end(), [](const auto& v) { return v.is_string(); }))
    throw InvalidArgument(
        fmt::format("{}: expected a JSON list of strings (e.g. '[\"*\"]'), got '{}'", flag, text));
  return j.get<std::vector<std::string>>();
}

// `--compilation-config` JSON → `--cudagraph-mode X` plus notes for keys serval ignores.
void fold_compilation_config(const std::string& text, PreprocessedArgs& out) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw InvalidArgument("--compilation-config: expected a JSON object, got '" + text + "'");
  for (const auto& [key, value] : j.items()) {
    if (key == "cudagraph_mode" && value.is_string()) {
      out.args.push_back("--cudagraph-mode");
      out.args.push_back(check_cudagraph_mode(value.get<std::string>()));
    } else {
      out.ignored.push_back(
          fmt::format("--compilation-config.{} (serval has no torch.compile)", key));
    }
  }
}

// vLLM's short flags as their long names; any other word as it is.
std::string_view expand_short_flag(std::string_view arg) {
  if (arg == "-tp") return "--tensor-parallel-size";
  if (arg == "-h") return "--help";
  if (arg == "-O") return "--compilation-config";
  if (arg == "-q") return "--quantization";
  return arg;
}

// A command-line word as the flag it names: `--x_y=v` → `--x-y`, short forms expanded; "" for
// a value or the positional model.
std::string flag_name(std::string_view arg) {
  arg = expand_short_flag(arg);
  if (!arg.starts_with("--")) return "";
  std::string name(arg.substr(0, arg.find('=')));
  std::ranges::replace(name, '_', '-');
  return name;
}

bool has_no_form(const std::string& flag) {
  return find_known(flag) != nullptr || find_ignored(flag) != nullptr;
}

// `--config FILE` (vLLM's): the file's flags (config_file.h) go before the command line's, each
// one only when the command line does not set that flag (or its --no- form) itself; its `model`
// only when the command line names none.
std::vector<std::string> with_config_file(const std::vector<std::string>& in) {
  std::vector<std::string> cli;
  std::optional<std::string> path;
  for (size_t i = 0; i < in.size(); ++i) {
    if (flag_name(in[i]) != "--config") {
      cli.push_back(in[i]);
      continue;
    }
    if (path) throw InvalidArgument("--config given twice");
    if (const size_t eq = in[i].find('='); eq != std::string::npos)
      path = in[i].substr(eq + 1);
    else if (i + 1 < in.size())
      path = in[++i];
    else
      throw InvalidArgument("--config needs a value");
  }
  if (!path) return cli;
  std::set<std::string> set_here;
  for (const std::string& arg : cli) {
    std::string name = flag_name(arg);
    if (name.starts_with("--no-")) name = "--" + name.substr(5);
    if (!name.empty()) set_here.insert(name);
  }
  if (!cli.empty() && !cli.front().starts_with('-')) set_here.insert("--model");
  std::vector<std::string> out;
  for (std::vector<std::string>& group : config_file_flags(*path, has_no_form)) {
    std::string name = group.front();
    if (name.starts_with("--no-")) name = "--" + name.substr(5);
    if (name == "--config")
      throw InvalidArgument("--config " + *path + ": a config file names another config file");
    if (set_here.contains(name)) continue;
    for (std::string& word : group) out.push_back(std::move(word));
  }
  out.insert(out.end(), cli.begin(), cli.end());
  return out;
}

}  // namespace

std::string nearest_flag(std::string_view flag) {
  std::string best;
  size_t best_d = SIZE_MAX;
  auto consider = [&](const char* name) {
    size_t d = edit_distance(flag, name);
    if (d < best_d) best_d = d, best = name;
  };
  for (const auto& f : kKnown) consider(f.name);
  for (const auto& f : kIgnored) consider(f.name);
  return best;
}

PreprocessedArgs preprocess_serve_args(const std::vector<std::string>& in) {
  PreprocessedArgs out;
  for (size_t i = 0; i < in.size(); ++i) {
    std::string arg(expand_short_flag(in[i]));
    if (arg.size() < 3 || !arg.starts_with("--")) {  // positional (the model) or a value
      if (arg.starts_with("-") && arg.size() > 1 &&
          !std::isdigit(static_cast<unsigned char>(arg[1])))
        throw InvalidArgument(fmt::format("unknown flag '{}'", arg));
      out.args.push_back(arg);
      continue;
    }
    const std::string name = flag_name(arg);
    const size_t eq = arg.find('=');
    const bool has_value = eq != std::string::npos;
    const std::string value = has_value ? arg.substr(eq + 1) : "";
    auto take_value = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= in.size()) throw InvalidArgument(fmt::format("{} needs a value", name));
      return in[++i];
    };
    if (name.starts_with("--compilation-config.")) {
      std::string key = name.substr(std::string_view("--compilation-config.").size());
      std::replace(key.begin(), key.end(), '-', '_');
      std::string v = take_value();
      if (key == "cudagraph_mode") {
        out.args.push_back("--cudagraph-mode");
        out.args.push_back(check_cudagraph_mode(v));
      } else {
        out.ignored.push_back(
            fmt::format("--compilation-config.{} (serval has no torch.compile)", key));
      }
      continue;
    }
    if (name == "--compilation-config") {
      fold_compilation_config(take_value(), out);
      continue;
    }
    if (const IgnoredFlag* f = find_ignored(name)) {
      std::string v = f->takes_value ? take_value() : "";
      if (name == "--pipeline-parallel-size" && v != "1")
        throw InvalidArgument(
            fmt::format("{} {}: serval supports only 1 ({})", name, v, f->reason));
      out.ignored.push_back(fmt::format("{} ({})", name, f->reason));
      continue;
    }
    const KnownFlag* k = find_known(name);
    if (!k)
      throw InvalidArgument(
          fmt::format("unknown flag '{}'; did you mean '{}'?", name, nearest_flag(name)));
    out.args.push_back(name);
    if (k->takes_value)
      out.args.push_back(take_value());
    else if (has_value)
      throw InvalidArgument(fmt::format("{} takes no value", name));
  }
  return out;
}

ServeArgs parse_serve_args(const std::vector<std::string>& args, const char* env_moe_backend,
                           const char* env_api_key) {
  ServeArgs out;
  PreprocessedArgs pre = preprocess_serve_args(with_config_file(args));
  out.ignored = std::move(pre.ignored);
  auto& e = out.engine;
  auto& s = out.server;
  std::string positional_model, moe_backend;
  bool prefix = false, no_prefix = false;
  CLI::App app{"serval serve: an OpenAI-compatible server (flags as in vllm serve)", "serve"};
  app.add_option("model_tag", positional_model, "Model folder (config.json, *.safetensors)");
  app.add_option("--model", e.model_dir, "Model folder (same as the positional argument)");
  app.add_option("--host", s.host, "Host to listen on")->capture_default_str();
  app.add_option("--port", s.port, "Port to listen on")->capture_default_str();
  app.add_option("--uds", s.uds, "Listen on this Unix domain socket instead of --host and --port");
  app.add_option("--served-model-name", s.served_model_names,
                 "Names the API accepts in 'model'; the first is reported");
  app.add_option("--dtype", e.dtype, "auto, bfloat16, float16 or float32")
      ->check(CLI::IsMember({"auto", "bfloat16", "float16", "float32", "half", "float", "bf16"}));
  app.add_option("--max-model-len", e.max_model_len, "Context length (0: from config.json)");
  app.add_option("--max-num-seqs", e.max_num_seqs, "Max sequences per step")->capture_default_str();
  app.add_option("--max-num-batched-tokens", e.max_num_batched_tokens, "Token budget per step");
  app.add_option("--gpu-memory-utilization", e.gpu_memory_utilization, "Fraction of GPU memory")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", e.kv_cache_dtype, "auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"}));
  app.add_option("--kv-cache-memory-bytes", e.cpu_kv_cache_bytes, "KV cache size in bytes");
  app.add_option("--block-size", e.block_size, "KV block size in tokens")->capture_default_str();
  app.add_option("--tensor-parallel-size", e.tensor_parallel_size, "GPUs per model");
  app.add_option("--data-parallel-size", e.data_parallel_size,
                 "Engine replicas (each with --tensor-parallel-size GPUs), balanced by load");
  app.add_flag("--enable-expert-parallel", e.enable_expert_parallel, "Shard experts over GPUs");
  app.add_option("--nnodes", e.nnodes,
                 "Nodes sharing the tensor-parallel group (one process each)");
  std::optional<int> node_rank;
  app.add_option("--node-rank", node_rank,
                 "This node's rank (else SLURM_PROCID, OMPI_COMM_WORLD_RANK, 0); node 0 serves");
  app.add_option("--dist-init-addr", e.dist_init_addr, "HOST:PORT where node 0 meets the others");
  app.add_option("--dist-timeout", e.dist_timeout_s, "Seconds to wait for the other nodes")
      ->capture_default_str();
  app.add_flag("--enable-prefix-caching", prefix, "Reuse KV blocks of shared prefixes (default)");
  app.add_flag("--no-enable-prefix-caching", no_prefix, "Disable prefix caching");
  app.add_option("--moe-backend", moe_backend,
                 "MoE expert backend: latency (default) or throughput; env SERVAL_MOE_BACKEND");
  app.add_option("--load-format", e.load_format, "auto, safetensors or dummy")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  app.add_option("--quantization", e.quantization,
                 "The checkpoint's quantization (checked; default: read from the checkpoint)")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(quant::kQuantizationChoices),
                                                     std::end(quant::kQuantizationChoices))));
  app.add_option("--seed", e.seed, "Random seed");
  app.add_option("--api-key", s.api_key, "Require 'Authorization: Bearer <key>' on /v1");
  app.add_option("--generation-config", e.generation_config, "auto, vllm or a folder");
  app.add_option("--override-generation-config", e.override_generation_config,
                 "Sampling defaults over the generation config's, a JSON object (e.g. "
                 "'{\"temperature\": 0.6}')");
  app.add_option("--hf-overrides", e.hf_overrides,
                 "A JSON object merged into the model's config.json before it is read (e.g. "
                 "'{\"max_position_embeddings\": 65536}')");
  app.add_option("--tokenizer", e.tokenizer,
                 "Folder with tokenizer.json and tokenizer_config.json (default: the model's)");
  app.add_option("--chat-template", e.chat_template,
                 "Chat template: a file, or the template itself (default: the tokenizer's)");
  app.add_option("--max-logprobs", e.max_logprobs, "Max logprobs per token")->capture_default_str();
  std::string content_format = "auto";
  app.add_option("--chat-template-content-format", content_format,
                 "Message content for the chat template: string, openai (a list of text parts) "
                 "or auto (openai when the template loops over a message's content)")
      ->check(CLI::IsMember({"auto", "string", "openai"}))
      ->capture_default_str();
  bool auto_tool_choice = false;
  std::string tool_call_parser;
  app.add_flag("--enable-auto-tool-choice", auto_tool_choice,
               "Parse tool calls out of chat outputs when a request has tools");
  app.add_option("--tool-call-parser", tool_call_parser,
                 "The tool call format of --enable-auto-tool-choice: hermes (Hermes, Qwen), "
                 "llama3_json (Llama 3.1-3.3), pythonic (Llama 3.2 and 4), mistral or "
                 "qwen3_coder (Qwen3-Coder)");
  app.add_flag("--enable-prompt-tokens-details", s.prompt_tokens_details,
               "Report usage.prompt_tokens_details.cached_tokens (prefix-cache hits)");
  app.add_option("--response-role", s.response_role,
                 "The role of chat replies after a generation prompt")
      ->capture_default_str();
  app.add_flag("--enable-force-include-usage", s.force_include_usage,
               "End every stream with a usage chunk, as stream_options.include_usage does");
  app.add_flag("--return-tokens-as-token-ids", s.return_tokens_as_token_ids,
               "Logprob tokens as \"token_id:<id>\" (a request's return_tokens_as_token_ids "
               "overrides it)");
  std::string reasoning_parser;
  app.add_option("--reasoning-parser", reasoning_parser,
                 "Split chat outputs into reasoning and content: deepseek_r1, mistral or qwen3");
  app.add_option("--device", e.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_flag("--enforce-eager", e.enforce_eager, "Disable CUDA graphs");
  app.add_flag("--nvfp4-activations", e.nvfp4_activations,
               "NVFP4 checkpoints: quantize activations too (W4A4, static input scales)");
  app.add_flag("--async-scheduling,!--no-async-scheduling", e.async_scheduling,
               "Schedule and launch each greedy step while the one before runs, its tokens fed "
               "back on the device (on by default, as in vLLM)");
  app.add_option("--speculative-config", e.speculative_config,
                 "Speculative decoding, a JSON object: '{\"method\": \"ngram\", "
                 "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, "
                 "\"prompt_lookup_min\": 2}' (prompt lookup; optional "
                 "\"disable_by_batch_size\": B drafts only while fewer than B requests run)");
  app.add_option("--cudagraph-mode", e.cudagraph_mode,
                 "CUDA graph mode (also --compilation-config.cudagraph_mode)");
  app.add_option("--max-waiting-requests", e.max_waiting_requests, "Queue size before 503")
      ->capture_default_str();
  std::string runner = "auto", task = "auto", convert = "auto";
  app.add_option("--runner", runner,
                 "generate (text generation) or pooling (an embedding model: /v1/embeddings, each "
                 "input's last-token hidden state); auto: generate")
      ->check(CLI::IsMember({"auto", "generate", "pooling"}))
      ->capture_default_str();
  app.add_option("--task", task, "vLLM's older name for the runner: generate, or embed (pooling)")
      ->check(CLI::IsMember({"auto", "generate", "embed", "embedding"}))
      ->capture_default_str();
  app.add_option("--convert", convert,
                 "with --runner pooling: embed (the only conversion; last-token pooling)")
      ->check(CLI::IsMember({"auto", "none", "embed"}))
      ->capture_default_str();
  std::string pooler_config;
  app.add_option(
      "--pooler-config", pooler_config,
      "With --runner pooling, vLLM's pooler settings as JSON: pooling_type LAST (the only "
      "one), normalize (the default of requests' `normalize`)");
  std::string scheduling_policy = "fcfs";
  app.add_option("--scheduling-policy", scheduling_policy,
                 "fcfs (first come, first served) or priority (by each request's `priority`, "
                 "lower first, then arrival; the lowest is preempted first)")
      ->check(CLI::IsMember({"fcfs", "priority"}))
      ->capture_default_str();
  app.add_option("--http-threads", s.num_http_threads, "HTTP I/O threads")->capture_default_str();
  std::string allowed_origins = "[\"*\"]", allowed_methods = "[\"*\"]", allowed_headers = "[\"*\"]";
  app.add_option("--allowed-origins", allowed_origins, "CORS: allowed origins, a JSON list")
      ->capture_default_str();
  app.add_option("--allowed-methods", allowed_methods, "CORS: allowed methods, a JSON list")
      ->capture_default_str();
  app.add_option("--allowed-headers", allowed_headers, "CORS: allowed headers, a JSON list")
      ->capture_default_str();
  app.add_flag("--allow-credentials", s.cors.credentials, "CORS: allow credentials");
  app.add_flag("--enable-request-id-headers", s.request_id_headers,
               "Answer every request with an X-Request-Id header (its own, or a new id)");
  std::vector<std::string> reversed(pre.args.rbegin(), pre.args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out.help = true;
    out.help_text = app.help();
    return out;
  } catch (const CLI::ParseError& err) {
    throw InvalidArgument(err.what());
  }
  if (!positional_model.empty()) {
    if (!e.model_dir.empty() && e.model_dir != positional_model)
      throw InvalidArgument(
          fmt::format("model given twice: '{}' and --model '{}'", positional_model, e.model_dir));
    e.model_dir = positional_model;
  }
  if (e.model_dir.empty()) throw InvalidArgument("no model: pass a model folder or --model");
  if (prefix && no_prefix)
    throw InvalidArgument("--enable-prefix-caching and --no-enable-prefix-caching conflict");
  e.enable_prefix_caching = !no_prefix;
  if (s.api_key.empty() && env_api_key != nullptr) s.api_key = env_api_key;
  e.priority_scheduling = s.priority_scheduling = scheduling_policy == "priority";
  const bool embed_task = task == "embed" || task == "embedding";
  if ((runner == "generate" && (embed_task || convert == "embed")) ||
      (task == "generate" && runner == "pooling"))
    throw InvalidArgument(
        fmt::format("--runner {} contradicts --task {} / --convert {}", runner, task, convert));
  e.pooling = runner == "pooling" || embed_task || convert == "embed";
  if (!pooler_config.empty()) s.embed_normalize = parse_pooler_config(pooler_config);
  s.content_format = content_format == "string"   ? ContentFormat::kString
                     : content_format == "openai" ? ContentFormat::kOpenAi
                                                  : ContentFormat::kAuto;
  // Ranges before anything loads (load_model checks again): --block-size 0 used to divide by
  // zero at engine start, --gpu-memory-utilization 2 was taken as given.
  runtime::check_engine_config(e);
  if (s.num_http_threads < 1)
    throw InvalidArgument(fmt::format("--http-threads must be >= 1, got {}", s.num_http_threads));
  if (e.dtype == "half") e.dtype = "float16";
  if (e.dtype == "float") e.dtype = "float32";
  if (e.dtype == "bf16") e.dtype = "bfloat16";
  const char* source = "--moe-backend";
  if (moe_backend.empty() && env_moe_backend && *env_moe_backend) {
    moe_backend = env_moe_backend;
    source = "SERVAL_MOE_BACKEND";
  }
  if (moe_backend.empty()) moe_backend = "latency";
  if (moe_backend != "latency" && moe_backend != "throughput")
    throw InvalidArgument(fmt::format("{}: invalid value '{}'; choose one of: latency, throughput",
                                      source, moe_backend));
  e.moe_backend = moe_backend;
  check_cudagraph_mode(e.cudagraph_mode);
  e.node_rank = dist::resolve_node_rank(node_rank, e.nnodes);
  if (e.nnodes > 1) {
    if (e.dist_init_addr.empty())
      throw InvalidArgument("--nnodes " + std::to_string(e.nnodes) +
                            " needs --dist-init-addr HOST:PORT (where node 0 listens)");
    dist::parse_host_port(e.dist_init_addr);  // InvalidArgument quoting a malformed address
  }
  if (!(e.dist_timeout_s > 0)) throw InvalidArgument("--dist-timeout must be > 0 seconds");
  if (s.port < 0 || s.port > 65535)
    throw InvalidArgument(fmt::format("--port {}: out of range", s.port));
  if (e.max_logprobs < 0) throw InvalidArgument("--max-logprobs must be >= 0");
  s.cors.origins = json_string_list("--allowed-origins", allowed_origins);
  s.cors.methods = json_string_list("--allowed-methods", allowed_methods);
  s.cors.headers = json_string_list("--allowed-headers", allowed_headers);
  std::optional<ToolCallParser> parser;
  if (!tool_call_parser.empty()) {
    parser = tool_call_parser_from_name(tool_call_parser);
    if (!parser)
      throw InvalidArgument(fmt::format("--tool-call-parser {}: unknown parser (choices: {})",
                                        tool_call_parser, kToolCallParserChoices));
  }
  if (auto_tool_choice && !parser)
    throw InvalidArgument(
        fmt::format("--enable-auto-tool-choice needs --tool-call-parser "
                    "(choices: {})",
                    kToolCallParserChoices));
  if (auto_tool_choice) s.tool_call_parser = *parser;
  if (!reasoning_parser.empty()) {
    const std::optional<ReasoningParser> parser = reasoning_parser_from_name(reasoning_parser);
    if (!parser)
      throw InvalidArgument(fmt::format("--reasoning-parser {}: unknown parser (choices: {})",
                                        reasoning_parser, kReasoningParserChoices));
    s.reasoning_parser = *parser;
  }
  s.max_logprobs = e.max_logprobs;
  if (!s.served_model_names.empty()) e.served_model_name = s.served_model_names.front();
  return out;
}

}  // namespace serval::server
