// `serval generate`: runs one prompt through the engine and prints the continuation.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <future>
#include <iostream>
#include <sstream>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "base/error.h"
#include "runtime/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::apps {

namespace {

struct GenerateOptions {
  runtime::EngineConfig engine;
  std::string prompt, prompt_ids;
  bool chat = false;
  runtime::SamplingParams sampling;
  float temperature = 0.0f;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      ids.push_back(std::stoi(item, &used));
      if (used != item.size() && item.find_first_not_of(' ', used) != std::string::npos)
        throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw InvalidArgument("--prompt-ids: '" + item + "' is not an integer token id");
    }
  }
  return ids;
}

int run_generate(const GenerateOptions& o) {
  auto engine = runtime::Engine::create(o.engine);
  const runtime::ModelInfo& info = engine->info();
  std::cerr << fmt::format("model {} ({}), {:.1f} M parameters, device {}, dtype {}{}\n",
                           info.model_dir, info.architecture, info.num_parameters / 1e6,
                           info.device, info.dtype,
                           info.moe_backend.empty() ? "" : ", MoE backend " + info.moe_backend);
  const tokenizer::Tokenizer* tok = engine->tokenizer();
  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    prompt = parse_ids(o.prompt_ids);
  } else {
    if (!tok)
      throw InvalidArgument(o.engine.model_dir + " has no tokenizer.json: use --prompt-ids");
    std::string text = o.prompt;
    bool add_special = true;
    if (o.chat) {
      if (!engine->chat_template()) throw InvalidArgument("the model has no chat template");
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      messages.push_back({{"role", "user"}, {"content", o.prompt}});
      text = engine->chat_template()->render(messages, true, nullptr, tok->bos_token(),
                                             tok->eos_token());
      add_special = false;
    }
    prompt = tok->encode(text, add_special);
  }
  runtime::SamplingParams params = o.sampling;
  params.temperature = o.temperature;
  std::promise<void> done;
  std::vector<int32_t> out;
  std::string error;
  engine->submit(prompt, params, [&](const runtime::RequestOutput& r) {
    out.insert(out.end(), r.new_token_ids.begin(), r.new_token_ids.end());
    if (r.finish) {
      error = r.error;
      done.set_value();
    }
  });
  done.get_future().wait();
  engine->shutdown();
  if (!error.empty()) throw Error(error);
  std::string ids;
  for (int32_t id : out) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  std::cout << "ids: " << ids << "\n";
  if (tok) std::cout << "text: " << tok->decode(out, true) << "\n";
  return 0;
}

}  // namespace

void register_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate a continuation of one prompt");
  cmd->add_option("--model,model", o->engine.model_dir, "Model folder")->required();
  cmd->add_option("--tokenizer", o->engine.tokenizer, "Tokenizer folder (default: the model's)");
  cmd->add_option("--prompt", o->prompt, "Prompt text");
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma separated");
  cmd->add_flag("--chat", o->chat, "Apply the model's chat template to the prompt");
  cmd->add_option("--max-tokens", o->sampling.max_tokens, "Tokens to generate")
      ->default_val(16)
      ->check(at_least(1));
  cmd->add_option("--temperature", o->temperature, "0 = greedy")
      ->default_val(0.0f)
      ->check(at_least(0));
  cmd->add_option("--top-p", o->sampling.top_p)->default_val(1.0f)->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--top-k", o->sampling.top_k)->default_val(0);
  cmd->add_option("--min-p", o->sampling.min_p)->default_val(0.0f);
  cmd->add_option("--seed", o->engine.seed, "Seed of sampling and dummy weights");
  cmd->add_flag("--ignore-eos", o->sampling.ignore_eos);
  cmd->add_option("--load-format", o->engine.load_format)
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  cmd->add_option("--dtype", o->engine.dtype)
      ->check(CLI::IsMember({"auto", "bfloat16", "float16", "float32"}));
  cmd->add_option("--device", o->engine.device)->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--nvfp4-activations", o->engine.nvfp4_activations,
                "NVFP4 checkpoints: quantize activations too (W4A4)");
  add_quantization_option(cmd, o->engine.quantization);
  cmd->add_option("--moe-backend", o->engine.moe_backend, "latency (default) or throughput")
      ->envname("SERVAL_MOE_BACKEND");
  cmd->add_option("--max-model-len", o->engine.max_model_len);
  cmd->add_option("--kv-cache-dtype", o->engine.kv_cache_dtype,
                  "auto, bfloat16, fp8 (= fp8_e4m3) or fp8_e5m2");
  cmd->add_option("--speculative-config", o->engine.speculative_config,
                  "Speculative decoding (greedy): '{\"method\": \"ngram\", "
                  "\"num_speculative_tokens\": 4}'");
  cmd->callback([o, cmd] {
    if (o->prompt.empty() == o->prompt_ids.empty())
      throw CLI::ValidationError("give exactly one of --prompt and --prompt-ids");
    o->engine.max_num_seqs = 1;
    if (cmd->count("--seed")) o->sampling.seed = o->engine.seed;
    try {
      run_generate(*o);
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace serval::apps
