// The file datasets of `serval bench serve` (vLLM's), their prompts tokenized by the server:
//   custom    JSONL, one {"prompt": "..."} per line (other keys ignored); each output is
//             --custom-output-len tokens; a prompt goes through the model's chat template as one
//             user message unless --skip-chat-template.
//   sharegpt  a JSON list of {"conversations": [{"from": "human", "value": ...},
//             {"from": "gpt", "value": ...}, ...]}: the first turn is the prompt as it is, the
//             second's token count the output length (or --sharegpt-output-len); pairs with fewer
//             than 4 tokens on either side, a prompt over 1024 tokens or more than 2048 in all are
//             skipped, as vLLM does.
// The prompts are shuffled by --seed; too few are repeated until there are --num-prompts.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "clients/bench_dataset.h"

namespace serval::clients {

struct TextPrompt {
  std::string prompt;
  std::optional<std::string> reference;  // sharegpt: the reply, whose length is the output's
};

// Throw InvalidArgument naming the file (and line or entry) when it cannot be read or is not the
// dataset's format.
std::vector<TextPrompt> read_custom_dataset(const std::string& path);
std::vector<TextPrompt> read_sharegpt_dataset(const std::string& path);

struct TextDatasetOptions {
  int num_prompts = 1000;
  std::optional<int> output_len;  // custom: every output's; sharegpt: overrides the references'
  bool chat_template = false;     // custom: tokenize prompts as chat (a user message)
  bool sharegpt_filter = false;   // skip pairs by vLLM's ShareGPT length rules
  uint64_t seed = 0;
};

// Token ids of `text`, as a chat user message (the model's template) or as it is.
using Tokenize = std::function<std::vector<int>(const std::string& text, bool as_chat)>;

std::vector<BenchRequest> text_requests(std::vector<TextPrompt> prompts,
                                        const TextDatasetOptions& o, const Tokenize& tokenize);

}  // namespace serval::clients
