// `serval eval gsm8k` (SPEC §6, like vLLM's gsm8k_eval.py): few-shot prompts, answer
// extraction, and the concurrent evaluation loop over /v1/completions.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace serval::clients {

struct Gsm8kItem {
  std::string question;
  std::string answer;  // worked solution ending in "#### N"
};

// Reads a GSM8K .jsonl file; throws LoadError naming the file and line on bad input.
std::vector<Gsm8kItem> load_gsm8k(const std::string& path);

// The answer of a text: commas removed, the last maximal run of ASCII digits; nullopt when
// there is none (an invalid response). A run with leading zeros such as "007" is invalid too,
// as Python's ast.literal_eval (vLLM's parser) rejects it; "0" and "00" give "0".
// The result has no leading zeros.
std::optional<std::string> extract_answer(std::string_view text);

// The first `num_shots` train items as "Question: {q}\nAnswer: {a}\n\n", then
// "Question: {question}\nAnswer:".
std::string build_prompt(const std::vector<Gsm8kItem>& train, int num_shots,
                         std::string_view question);

struct Gsm8kOptions {
  std::string base_url = "http://127.0.0.1:8000";
  int num_questions = -1;  // -1: all
  int num_shots = 5;
  int max_tokens = 256;
  int max_concurrency = 100;
  std::string data_dir;  // empty: ~/.cache/serval/gsm8k, downloaded when missing
  int seed = 42;
  double temperature = 0;
  std::string model;  // empty: no "model" field
  std::string save_results;
  double request_timeout_s = 600;
  bool progress = true;
};

// Returns the folder with train.jsonl and test.jsonl: `data_dir` if set (must hold both),
// else the cache folder, filling it from the public location when files are missing.
std::string gsm8k_data_dir(const std::string& data_dir);

struct Gsm8kResult {
  double accuracy = 0, invalid = 0, latency_s = 0, questions_per_second = 0;
  int num_questions = 0, num_failed_requests = 0;
};

// Runs the evaluation and prints the four result lines (three decimals) to stdout.
Gsm8kResult eval_gsm8k(const Gsm8kOptions& options);

}  // namespace serval::clients
