// Speculative decoding by prompt lookup (vLLM's --speculative-config method "ngram"): a request's
// next tokens are guessed from an earlier occurrence of its last n tokens and computed in one
// step; the engine then samples each position as plain decoding would and keeps the guesses as
// far as the samples agree, so each step yields one to num_speculative_tokens + 1 tokens with
// outputs identical to plain decoding (greedy or seeded).
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace serval::runtime {

struct SpeculativeConfig {
  int num_speculative_tokens = 0;  // 0: off
  // n-gram sizes tried, longest first (vLLM's prompt_lookup_max / _min).
  int prompt_lookup_min = 5, prompt_lookup_max = 5;
  // No drafts in a step while this many requests or more run (vLLM's disable_by_batch_size:
  // larger batches are compute-bound, where drafted tokens cost as much as real ones); 0: never.
  int disable_by_batch_size = 0;
  bool enabled() const { return num_speculative_tokens > 0; }
  // Whether a step with `running` requests drafts at all.
  bool drafts_at(size_t running) const {
    return disable_by_batch_size == 0 || running < size_t(disable_by_batch_size);
  }
};

// --speculative-config, a JSON object: {"method": "ngram", "num_speculative_tokens": K,
// "prompt_lookup_max": MAX, "prompt_lookup_min": MIN, "disable_by_batch_size": B} (the lookups
// default to each other, or 5 when neither is given, as in vLLM; B is optional and at least 2).
// An empty text: off. InvalidArgument naming the key for malformed JSON, another method, missing
// or out-of-range counts, MIN > MAX, or unknown keys.
SpeculativeConfig parse_speculative_config(std::string_view json);

// The draft proposer of one growing sequence. propose() returns up to `max_drafts` tokens to
// follow `tokens`: for n from prompt_lookup_max down to prompt_lookup_min, the last n tokens are
// looked up in the sequence before them; at the most recent earlier occurrence, the tokens that
// followed it (at most to the end of the sequence) are the proposal; empty when no n-gram recurs
// or max_drafts <= 0. Without rescanning the sequence: the positions of each token are indexed
// as it grows, and only the earlier occurrences of its last token are candidates (the longest
// match wins, the most recent among equals), so a step costs the number of those occurrences
// times prompt_lookup_max instead of the sequence's length.
class NgramIndex {
 public:
  // `tokens` must extend the sequence of earlier calls (its first tokens unchanged).
  std::vector<int32_t> propose(std::span<const int32_t> tokens, const SpeculativeConfig& c,
                               int max_drafts);

 private:
  std::unordered_map<int32_t, std::vector<int32_t>> positions_;  // token → ascending positions
  size_t indexed_ = 0;  // tokens[0, indexed_) are in positions_
};

}  // namespace serval::runtime
