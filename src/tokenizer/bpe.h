// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocab, merges by
// rank, byte fallback, unknown-token fusing, ignore_merges, and a word cache.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::tokenizer {

// Hash that lets unordered maps keyed by std::string be probed with string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // Throws LoadError when the model is not BPE or a merge names an unknown token.
  explicit BpeModel(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word (valid UTF-8, non-empty).
  // Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Null when `id` is not in the vocab.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  TokenMap vocab_;
  std::vector<const std::string*> id_to_token_;  // points into vocab_ keys; null for gaps
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // id of "<0xNN>" or -1

  static constexpr size_t kCacheCapacity = 50000;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace serval::tokenizer
