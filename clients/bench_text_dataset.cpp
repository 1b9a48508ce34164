#include "clients/bench_text_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "base/error.h"

namespace serval::clients {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("--dataset-path {}: cannot open the file", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// vLLM's ShareGPT bounds: too short to measure, or too long for a 2048-token context.
bool sharegpt_pair_ok(size_t prompt_len, size_t output_len) {
  return prompt_len >= 4 && output_len >= 4 && prompt_len <= 1024 &&
         prompt_len + output_len <= 2048;
}

}  // namespace

std::vector<TextPrompt> read_custom_dataset(const std::string& path) {
  std::istringstream lines(read_all(path));
  std::vector<TextPrompt> out;
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      throw InvalidArgument(fmt::format(
          "--dataset-path {}: line {} is not a JSON object with a string \"prompt\"", path, n));
    out.push_back({j["prompt"].get<std::string>(), std::nullopt});
  }
  if (out.empty()) throw InvalidArgument(fmt::format("--dataset-path {}: no prompts", path));
  return out;
}

std::vector<TextPrompt> read_sharegpt_dataset(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(read_all(path), nullptr, false);
  if (!j.is_array())
    throw InvalidArgument(
        fmt::format("--dataset-path {}: expected a JSON list of entries with "
                    "\"conversations\"",
                    path));
  std::vector<TextPrompt> out;
  for (const nlohmann::json& entry : j) {
    const auto turns = entry.is_object() ? entry.find("conversations") : entry.end();
    if (turns == entry.end() || !turns->is_array() || turns->size() < 2) continue;  // as vLLM
    const nlohmann::json& first = (*turns)[0];
    const nlohmann::json& second = (*turns)[1];
    if (!first.is_object() || !second.is_object() ||
        !first.value("value", nlohmann::json()).is_string() ||
        !second.value("value", nlohmann::json()).is_string())
      continue;
    out.push_back({first["value"].get<std::string>(), second["value"].get<std::string>()});
  }
  if (out.empty())
    throw InvalidArgument(
        fmt::format("--dataset-path {}: no conversation with two text turns", path));
  return out;
}

std::vector<BenchRequest> text_requests(std::vector<TextPrompt> prompts,
                                        const TextDatasetOptions& o, const Tokenize& tokenize) {
  std::mt19937_64 rng(o.seed);
  std::shuffle(prompts.begin(), prompts.end(), rng);
  std::vector<BenchRequest> out;
  for (const TextPrompt& p : prompts) {
    if (static_cast<int>(out.size()) == o.num_prompts) break;
    BenchRequest r;
    r.prompt = tokenize(p.prompt, o.chat_template);
    r.text = p.prompt;
    // The output length: the option's, else the reference reply's (tokenized only then).
    r.output_len = o.output_len  ? *o.output_len
                   : p.reference ? static_cast<int>(tokenize(*p.reference, false).size())
                                 : 0;
    if (o.sharegpt_filter && !sharegpt_pair_ok(r.prompt.size(), size_t(r.output_len))) continue;
    if (r.prompt.empty() || r.output_len < 1) continue;
    out.push_back(std::move(r));
  }
  if (out.empty()) throw InvalidArgument("the dataset has no prompt that can be sent");
  for (size_t i = 0; static_cast<int>(out.size()) < o.num_prompts; ++i) {  // too few: repeat
    BenchRequest again = out[i];
    out.push_back(std::move(again));
  }
  return out;
}

}  // namespace serval::clients
