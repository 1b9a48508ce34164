// BPE merging with a priority queue over a linked list of symbols:
// O(n log n) per word.
#include "tokenizer/bpe.h"

#include <queue>

#include <fmt/format.h>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace serval::tokenizer {

BpeModel::BpeModel(const nlohmann::json& m) {
  const std::string type = m.value("type", "BPE");
  if (type != "BPE")
    throw LoadError(
        fmt::format("tokenizer.json: model type '{}' is not supported (BPE only)", type));
  const auto& vocab = m.at("vocab");
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    if (id < 0)
      throw LoadError(fmt::format("tokenizer.json: negative id for token '{}'", it.key()));
    vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& [token, id] : vocab_) id_to_token_[id] = &token;

  auto opt_string = [&](const char* key) {
    auto it = m.find(key);
    return it == m.end() || it->is_null() ? std::string() : it->get<std::string>();
  };
  continuing_subword_prefix_ = opt_string("continuing_subword_prefix");
  end_of_word_suffix_ = opt_string("end_of_word_suffix");
  if (const std::string unk = opt_string("unk_token"); !unk.empty()) {
    if (auto id = token_to_id(unk)) unk_id_ = *id;
  }
  auto opt_bool = [&](const char* key) {
    auto it = m.find(key);
    return it != m.end() && it->is_boolean() && it->get<bool>();
  };
  byte_fallback_ = opt_bool("byte_fallback");
  fuse_unk_ = opt_bool("fuse_unk");
  ignore_merges_ = opt_bool("ignore_merges");
  for (int b = 0; b < 256; ++b) {
    auto id = token_to_id(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = id ? *id : -1;
  }

  const auto& merges = m.at("merges");
  merges_.reserve(merges.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  int32_t rank = 0;
  for (const auto& entry : merges) {
    std::string a, b;
    if (entry.is_array()) {
      a = entry.at(0).get<std::string>();
      b = entry.at(1).get<std::string>();
    } else {
      const std::string& s = entry.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos)
        throw LoadError(fmt::format("tokenizer.json: merge {} '{}' is not two tokens", rank, s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    }
    auto ia = token_to_id(a), ib = token_to_id(b);
    std::string merged =
        a + (prefix_len && b.starts_with(continuing_subword_prefix_) ? b.substr(prefix_len) : b);
    auto im = token_to_id(merged);
    if (!ia || !ib || !im)
      throw LoadError(
          fmt::format("tokenizer.json: merge {} ('{}' '{}') uses a token missing "
                      "from the vocab",
                      rank, a, b));
    merges_.emplace(pair_key(*ia, *ib), Merge{rank, *im});
    ++rank;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) return nullptr;
  return id_to_token_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  bool last_was_unk = false;
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    i += utf8::char_len(static_cast<unsigned char>(word[i]));
    const std::string_view ch = word.substr(start, i - start);
    std::optional<int32_t> id;
    if (continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
      id = token_to_id(ch);
    } else {
      piece.clear();
      if (start > 0) piece.append(continuing_subword_prefix_);
      piece.append(ch);
      if (i >= word.size()) piece.append(end_of_word_suffix_);
      id = token_to_id(piece);
    }
    auto push = [&](int32_t v) {
      const auto n = static_cast<int32_t>(sym.size());
      sym.push_back({v, n - 1, n + 1, true});
    };
    if (id) {
      push(*id);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) push(byte_ids_[b]);
        last_was_unk = false;
        continue;
      }
    }
    if (!unk_id_) continue;  // no unknown token: the character is dropped, as in HF
    if (!(fuse_unk_ && last_was_unk)) push(*unk_id_);
    last_was_unk = true;
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t pos) {
    const int32_t nx = sym[pos].next;
    if (nx < 0) return;
    auto it = merges_.find(pair_key(sym[pos].id, sym[nx].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t p = 0; p + 1 < static_cast<int32_t>(sym.size()); ++p) consider(p);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != c.new_id || it->second.rank != c.rank)
      continue;  // stale: one side changed since this candidate was queued
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int32_t p = 0; p >= 0; p = sym[p].next) out.push_back(sym[p].id);
}

}  // namespace serval::tokenizer
