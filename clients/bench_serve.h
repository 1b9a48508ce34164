// `serval bench serve`: the whole benchmark (model discovery, dataset, load, report, files).
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "clients/bench_metrics.h"

namespace serval::clients {

struct BenchServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string backend = "openai";  // openai or vllm: completions; openai-chat: chat completions
  std::string endpoint;            // empty: /v1/completions, or /v1/chat/completions for chat
  std::string model;               // empty: the first id of GET /v1/models
  std::string dataset_name = "random";  // random, custom or sharegpt (bench_text_dataset.h)
  std::string dataset_path;             // custom, sharegpt: the file
  int custom_output_len = 256;
  std::optional<int> sharegpt_output_len;  // unset: each reference reply's length
  bool skip_chat_template = false;         // custom: send prompts without the chat template
                                           // (not with openai-chat: the server applies it)
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0;
  int random_prefix_len = 0;
  int num_prompts = 1000;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1;
  std::optional<int> max_concurrency;
  bool ignore_eos = false;
  uint64_t seed = 0;
  std::optional<int> vocab_size;  // token ids of random prompts; unset: asked from the server
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::vector<double> metric_percentiles = {99};
  std::vector<std::string> goodput;  // "ttft:MS", "tpot:MS", "e2el:MS"
  int num_warmups = 0;
  bool save_result = false;
  std::string result_dir = ".";
  std::string result_filename;  // empty: vLLM's default name
  bool plot = false;
  double request_timeout_s = 600;
  bool disable_tqdm = false;
};

// Parses --goodput items; throws InvalidArgument on an unknown key or a negative value.
GoodputSlo parse_goodput(const std::vector<std::string>& items);

// Runs the benchmark and prints its report to stdout. Returns the exit status: non-zero when
// every request failed or the server could not be used.
int bench_serve(const BenchServeOptions& options);

}  // namespace serval::clients
