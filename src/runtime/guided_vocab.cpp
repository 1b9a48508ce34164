#include "runtime/guided_vocab.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace serval::runtime {

namespace {

constexpr uint32_t kNoSpecial = std::numeric_limits<uint32_t>::max();

// Bytes that change a string's state (or end it) on their own.
bool string_special(char c) {
  return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
}

// Where a string's state may change in `t` from `from` on: a '"', '\', control byte, or a
// character that is not complete, well-formed UTF-8 within `t`. kNoSpecial: nowhere; the bytes
// before it are whole characters of content, which leave a plain string's state as it is.
uint32_t first_special_from(std::string_view t, size_t from) {
  const size_t bad = tokenizer::utf8::find_invalid(t.substr(from));
  const size_t incomplete = bad == tokenizer::utf8::kValid ? t.size() : from + bad;
  size_t i = from;
  while (i < incomplete && !string_special(t[i])) ++i;
  return i == t.size() ? kNoSpecial : uint32_t(i);
}

}  // namespace

GuidedVocab::GuidedVocab(std::vector<std::string> texts, const std::vector<bool>& excluded)
    : texts_(std::move(texts)) {
  for (size_t id = 0; id < texts_.size(); ++id)
    if (!texts_[id].empty() && !(id < excluded.size() && excluded[id]))
      order_.push_back(int32_t(id));
  std::sort(order_.begin(), order_.end(),
            [this](int32_t a, int32_t b) { return texts_[size_t(a)] < texts_[size_t(b)]; });
  first_special_.reserve(order_.size());
  for (size_t i = 0; i < order_.size(); ++i)
    first_special_.push_back(first_special_from(sorted_text(i), 0));
  build_trie();
}

void GuidedVocab::build_trie() {
  trie_.push_back(TrieNode{0, 0, uint32_t(order_.size()), 0, 0, 0});
  std::vector<std::pair<uint32_t, size_t>> pending = {{0, 0}};  // (node, its depth)
  while (!pending.empty()) {
    const auto [index, depth] = pending.back();
    pending.pop_back();
    uint32_t i = trie_[index].begin;
    const uint32_t end = trie_[index].end;
    while (i < end && sorted_text(i).size() == depth) ++i;  // shortest first: these end here
    trie_[index].ends = i;
    trie_[index].first_child = uint32_t(trie_.size());
    while (i < end) {  // one child per run of the same byte at `depth` (sorted: contiguous)
      const char c = sorted_text(i)[depth];
      uint32_t j = i + 1;
      while (j < end && sorted_text(j)[depth] == c) ++j;
      pending.emplace_back(uint32_t(trie_.size()), depth + 1);
      trie_.push_back(TrieNode{i, i, j, 0, 0, static_cast<uint8_t>(c)});
      ++trie_[index].num_children;
      i = j;
    }
  }
}

GuidedVocab GuidedVocab::from_tokenizer(const tokenizer::Tokenizer& tok) {
  const int n = tok.vocab_size();
  std::vector<std::string> texts(static_cast<size_t>(n));
  std::vector<bool> excluded(static_cast<size_t>(n), false);
  for (int32_t id = 0; id < n; ++id) {
    if (tok.id_to_token(id).empty()) continue;
    excluded[size_t(id)] = tok.is_special(id);
    texts[size_t(id)] = tok.token_bytes(id);
  }
  return GuidedVocab(std::move(texts), excluded);
}

void GuidedVocab::allow_accepted(const JsonMatcher& m, std::vector<uint8_t>& allowed) const {
  visit(0, 0, m, allowed);
}

void GuidedVocab::allow_accepted(const GbnfMatcher& m, std::vector<uint8_t>& allowed) const {
  if (const std::vector<uint64_t>* bits = m.remembered_mask()) return unpack(*bits, allowed);
  std::vector<uint8_t> walked(texts_.size(), 0);
  visit_states(0, m, m.state(), walked);
  m.remember_mask(pack(walked));
  unpack(*m.remembered_mask(), allowed);
}

std::vector<uint64_t> GuidedVocab::pack(const std::vector<uint8_t>& allowed) const {
  std::vector<uint64_t> bits((texts_.size() + 63) / 64, 0);
  for (size_t id = 0; id < texts_.size(); ++id)
    if (allowed[id]) bits[id / 64] |= uint64_t{1} << (id % 64);
  return bits;
}

void GuidedVocab::unpack(const std::vector<uint64_t>& bits, std::vector<uint8_t>& allowed) const {
  for (size_t w = 0; w < bits.size(); ++w)
    for (uint64_t b = bits[w]; b != 0; b &= b - 1)
      allowed[w * 64 + size_t(std::countr_zero(b))] = 1;
}

void GuidedVocab::allow_accepted(const OutputMatcher& m, std::vector<uint8_t>& allowed) const {
  m.visit([&](const auto& matcher) { allow_accepted(matcher, allowed); });
}

// The tokens under trie node `node` share their first `depth` bytes, which `m` has accepted.
void GuidedVocab::visit(uint32_t node, size_t depth, const JsonMatcher& m,
                        std::vector<uint8_t>& allowed) const {
  const TrieNode& n = trie_[node];
  for (uint32_t i = n.begin; i < n.ends; ++i) allowed[size_t(order_[i])] = 1;
  if (n.ends == n.end) return;
  if (m.in_plain_string()) return visit_plain_string(n.ends, n.end, depth, m, allowed);
  for (uint32_t child = n.first_child; child < n.first_child + n.num_children; ++child) {
    JsonMatcher next = m;
    if (next.feed(trie_[child].byte)) visit(child, depth + 1, next, allowed);
  }
}

void GuidedVocab::visit_states(uint32_t node, const GbnfMatcher& m, int32_t state,
                               std::vector<uint8_t>& allowed) const {
  const TrieNode& n = trie_[node];
  for (uint32_t i = n.begin; i < n.ends; ++i) allowed[size_t(order_[i])] = 1;
  for (uint32_t child = n.first_child; child < n.first_child + n.num_children; ++child)
    if (const int32_t next = m.step(state, trie_[child].byte); next >= 0)
      visit_states(child, m, next, allowed);
}

// Inside a string: bytes up to a token's first special byte leave `m` as it is.
void GuidedVocab::visit_plain_string(size_t begin, size_t end, size_t depth, const JsonMatcher& m,
                                     std::vector<uint8_t>& allowed) const {
  for (size_t i = begin; i < end; ++i) {
    const std::string& t = sorted_text(i);
    size_t from = first_special_[i];
    // A special byte in the shared prefix, which `m` has taken: look past it.
    if (from != kNoSpecial && from < depth) from = first_special_from(t, depth);
    if (from == kNoSpecial) {
      allowed[size_t(order_[i])] = 1;
      continue;
    }
    JsonMatcher next = m;
    if (next.feed(std::string_view(t).substr(from))) allowed[size_t(order_[i])] = 1;
  }
}

}  // namespace serval::runtime
