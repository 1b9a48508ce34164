#include "runtime/speculative.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <string>

#include "base/error.h"

namespace serval::runtime {

namespace {

// An integer key of --speculative-config in [lo, hi], or nullopt when absent.
std::optional<int> int_in(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi)
    throw InvalidArgument(std::string("--speculative-config ") + key + " must be an integer in [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "], got " + it->dump());
  return it->get<int>();
}

}  // namespace

SpeculativeConfig parse_speculative_config(std::string_view json) {
  SpeculativeConfig c;
  if (json.empty()) return c;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object())
    throw InvalidArgument("--speculative-config must be a JSON object, got " + std::string(json));
  for (const auto& [key, value] : j.items())
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_max" &&
        key != "prompt_lookup_min" && key != "disable_by_batch_size")
      throw InvalidArgument("--speculative-config: '" + key +
                            "' is not supported (serval has method ngram, "
                            "num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, "
                            "disable_by_batch_size)");
  const auto method = j.find("method");
  if (method == j.end() || !method->is_string() || *method != "ngram")
    throw InvalidArgument(
        "--speculative-config method must be \"ngram\" (prompt lookup, the "
        "one method serval has), got " +
        (method == j.end() ? std::string("none") : method->dump()));
  const std::optional<int> k = int_in(j, "num_speculative_tokens", 1, 1024);
  if (!k) throw InvalidArgument("--speculative-config needs num_speculative_tokens");
  std::optional<int> hi = int_in(j, "prompt_lookup_max", 1, 1024),
                     lo = int_in(j, "prompt_lookup_min", 1, 1024);
  if (!hi && !lo) hi = lo = 5;
  if (!hi) hi = lo;
  if (!lo) lo = hi;
  if (*lo > *hi)
    throw InvalidArgument("--speculative-config prompt_lookup_min (" + std::to_string(*lo) +
                          ") exceeds prompt_lookup_max (" + std::to_string(*hi) + ")");
  // As vLLM: a threshold of 1 would never draft.
  c.disable_by_batch_size = int_in(j, "disable_by_batch_size", 2, 1 << 20).value_or(0);
  c.num_speculative_tokens = *k;
  c.prompt_lookup_min = *lo;
  c.prompt_lookup_max = *hi;
  return c;
}

std::vector<int32_t> NgramIndex::propose(std::span<const int32_t> tokens,
                                         const SpeculativeConfig& c, int max_drafts) {
  const int len = int(tokens.size());
  // Every token but the last is a possible match end; the last is what is looked up.
  for (; int(indexed_) < len - 1; ++indexed_)
    positions_[tokens[indexed_]].push_back(int32_t(indexed_));
  if (max_drafts <= 0 || len < 2) return {};
  const auto it = positions_.find(tokens[size_t(len - 1)]);
  if (it == positions_.end()) return {};
  // A match ending at j has length m: tokens[j − i] == tokens[len − 1 − i] for i < m (at most
  // prompt_lookup_max, and j + 1: it cannot start before the sequence).
  int best_len = 0, best_end = -1;
  const std::vector<int32_t>& ends = it->second;
  for (auto e = ends.rbegin(); e != ends.rend() && best_len < c.prompt_lookup_max; ++e) {
    const int j = *e, limit = std::min(c.prompt_lookup_max, j + 1);
    int m = 1;
    while (m < limit && tokens[size_t(j - m)] == tokens[size_t(len - 1 - m)]) ++m;
    if (m > best_len) best_len = m, best_end = j;
  }
  if (best_len < c.prompt_lookup_min) return {};
  const int from = best_end + 1, count = std::min(max_drafts, len - from);
  return {tokens.begin() + from, tokens.begin() + from + count};
}

}  // namespace serval::runtime
