// Pre-tokenizers.
#include "tokenizer/pre_tokenizer.h"

#include <array>

#include <fmt/format.h>

#include "base/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace serval::tokenizer {
namespace {

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 512> to_byte;
  ByteTables() {
    to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      utf8::append(to_unicode[b], static_cast<char32_t>(cp));
      to_byte[cp] = b;
    }
  }
};

const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& s) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  throw LoadError(fmt::format("tokenizer.json: unknown split behavior '{}'", s));
}

// Cuts `text` at the match ranges `matches` (sorted, disjoint) the way HF's
// NormalizedString::split does for `behavior`, appending pieces to `out`.
void split_by(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
              bool invert, Behavior behavior, std::vector<std::string>& out) {
  struct Part {
    size_t b, e;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t pos = 0;
  for (auto [b, e] : matches) {
    if (b > pos) parts.push_back({pos, b, invert});
    parts.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < text.size()) parts.push_back({pos, text.size(), invert});

  std::vector<std::pair<size_t, size_t>> pieces;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const auto& p : parts)
        if (!p.is_match) pieces.emplace_back(p.b, p.e);
      break;
    case Behavior::kIsolated:
      for (const auto& p : parts) pieces.emplace_back(p.b, p.e);
      break;
    case Behavior::kContiguous:
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0 && parts[i].is_match && parts[i - 1].is_match)
          pieces.back().second = parts[i].e;
        else
          pieces.emplace_back(parts[i].b, parts[i].e);
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].is_match && !pieces.empty() && i > 0 && !parts[i - 1].is_match)
          pieces.back().second = parts[i].e;
        else
          pieces.emplace_back(parts[i].b, parts[i].e);
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t i = 0; i < parts.size(); ++i) {
        if (!parts[i].is_match && i > 0 && parts[i - 1].is_match)
          pieces.back().second = parts[i].e;
        else
          pieces.emplace_back(parts[i].b, parts[i].e);
      }
      break;
  }
  for (auto [b, e] : pieces)
    if (e > b) out.emplace_back(text.substr(b, e - b));
}

class RegexSplit : public PreTokenizer {
 public:
  RegexSplit(const std::string& pattern, Behavior behavior, bool invert)
      : regex_(pattern, "Split pre-tokenizer"), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<std::string>& words, bool) const override {
    std::vector<std::string> out;
    for (const auto& w : words) split_by(w, regex_.find_all(w), invert_, behavior_, out);
    words.swap(out);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class LiteralSplit : public PreTokenizer {
 public:
  LiteralSplit(std::string literal, Behavior behavior, bool invert)
      : literal_(std::move(literal)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<std::string>& words, bool) const override {
    std::vector<std::string> out;
    for (const auto& w : words) {
      std::vector<std::pair<size_t, size_t>> matches;
      if (!literal_.empty())
        for (size_t p = w.find(literal_); p != std::string::npos;
             p = w.find(literal_, p + literal_.size()))
          matches.emplace_back(p, p + literal_.size());
      split_by(w, matches, invert_, behavior_, out);
    }
    words.swap(out);
  }

 private:
  std::string literal_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern, "ByteLevel pre-tokenizer");
  }
  void pre_tokenize(std::vector<std::string>& words, bool) const override {
    std::vector<std::string> split;
    for (auto& w : words) {
      std::string s = add_prefix_space_ && w[0] != ' ' ? " " + w : w;
      if (regex_)
        split_by(s, regex_->find_all(s), false, Behavior::kIsolated, split);
      else
        split.push_back(std::move(s));
    }
    words.clear();
    for (const auto& s : split) {
      std::string mapped;
      mapped.reserve(s.size() * 2);
      for (unsigned char b : s) mapped.append(tables().to_unicode[b]);
      words.push_back(std::move(mapped));
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class Metaspace final : public PreTokenizer {
 public:
  Metaspace(std::string replacement, std::string scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(std::move(scheme)), split_(split) {}
  void pre_tokenize(std::vector<std::string>& words, bool first_section) const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < words.size(); ++i) {
      std::string s;
      for (char c : words[i]) {
        if (c == ' ')
          s.append(replacement_);
        else
          s.push_back(c);
      }
      const bool prepend = scheme_ == "always" || (scheme_ == "first" && first_section && i == 0);
      if (prepend && s.compare(0, replacement_.size(), replacement_) != 0) s = replacement_ + s;
      if (!split_) {
        out.push_back(std::move(s));
        continue;
      }
      std::vector<std::pair<size_t, size_t>> matches;
      for (size_t p = s.find(replacement_); p != std::string::npos;
           p = s.find(replacement_, p + replacement_.size()))
        matches.emplace_back(p, p + replacement_.size());
      split_by(s, matches, false, Behavior::kMergedWithNext, out);
    }
    words.swap(out);
  }

 private:
  std::string replacement_, scheme_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<std::string>& words, bool first_section) const override {
    for (const auto& p : parts_) p->pre_tokenize(words, first_section);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

const std::string& byte_to_unicode(unsigned char b) {
  return tables().to_unicode[b];
}

int unicode_to_byte(char32_t cp) {
  return cp < 512 ? tables().to_byte[cp] : -1;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& c) {
  if (c.is_null()) return nullptr;
  const std::string type = c.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& sub : c.at("pretokenizers"))
      if (auto p = make_pre_tokenizer(sub)) parts.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(parts));
  }
  if (type == "Split") {
    const auto& p = c.at("pattern");
    const Behavior behavior = parse_behavior(c.at("behavior").get<std::string>());
    const bool invert = c.value("invert", false);
    if (p.contains("Regex"))
      return std::make_unique<RegexSplit>(p.at("Regex").get<std::string>(), behavior, invert);
    return std::make_unique<LiteralSplit>(p.at("String").get<std::string>(), behavior, invert);
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(c.value("add_prefix_space", true),
                                       c.value("use_regex", true));
  if (type == "Metaspace") {
    std::string scheme = c.value("prepend_scheme", "");
    if (scheme.empty()) scheme = c.value("add_prefix_space", true) ? "always" : "never";
    return std::make_unique<Metaspace>(c.value("replacement", "\xE2\x96\x81"), scheme,
                                       c.value("split", true));
  }
  if (type == "Digits")
    return std::make_unique<RegexSplit>(c.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+",
                                        Behavior::kIsolated, false);
  if (type == "Whitespace")
    return std::make_unique<RegexSplit>("\\w+|[^\\w\\s]+", Behavior::kRemoved, true);
  if (type == "WhitespaceSplit")
    return std::make_unique<RegexSplit>("\\s+", Behavior::kRemoved, false);
  if (type == "Punctuation")
    return std::make_unique<RegexSplit>(
        "[\\p{P}!-/:-@\\[-`{-~]", parse_behavior(c.value("behavior", std::string("Isolated"))),
        false);
  throw LoadError(fmt::format("tokenizer.json: unsupported pre_tokenizer type '{}'", type));
}

}  // namespace serval::tokenizer
