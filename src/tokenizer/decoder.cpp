// Decoders.
#include "tokenizer/decoder.h"

#include <fmt/format.h>

#include "base/error.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace serval::tokenizer {
namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out.append(s, pos, hit - pos).append(to);
  out.append(s, pos);
  s.swap(out);
}

// Maps each token's characters back to bytes; a token with a character
// outside the byte table (an added token) contributes its own UTF-8 bytes.
// Invalid UTF-8 becomes U+FFFD, unless decoding a piece.
class ByteLevel final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                        bool piece) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < t.size() && mapped;) {
        const int b = unicode_to_byte(utf8::next(t, i));
        if (b < 0)
          mapped = false;
        else
          bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) bytes.resize(mark), bytes.append(t);
    }
    return {piece ? bytes : utf8::decode_lossy(bytes)};
  }
};

class Metaspace final : public Decoder {
 public:
  Metaspace(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                        bool piece) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      replace_all(tokens[i], replacement_, i == 0 && strip_first_ && !piece ? "" : " ");
    return tokens;
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

// Runs of <0xNN> tokens become their UTF-8 text, or one U+FFFD per byte when
// the run is not valid UTF-8 (what HF tokenizers does; for a piece, the bytes).
class ByteFallback final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                        bool piece) const override {
    std::vector<std::string> out;
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (piece || utf8::find_invalid(run) == utf8::kValid) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>') {
        auto hex = [](char c) {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        };
        const int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
      }
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }
};

class Fuse final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                        bool /*piece*/) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character (not from a piece).
class Strip final : public Decoder {
 public:
  Strip(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                        bool piece) const override {
    if (piece) return tokens;  // a piece of a longer output: its ends are not the output's
    for (auto& t : tokens) {
      size_t b = 0, e = t.size();
      for (int i = 0; i < start_ && t.compare(b, content_.size(), content_) == 0 && b < e; ++i)
        b += content_.size();
      for (int i = 0; i < stop_ && e >= b + content_.size() &&
                      t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++i)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
    return tokens;
  }

 private:
  std::string content_;
  int start_, stop_;
};

class Replace final : public Decoder {
 public:
  explicit Replace(const nlohmann::json& c) : content_(c.value("content", "")) {
    const auto& p = c.at("pattern");
    if (p.contains("String"))
      literal_ = p.at("String").get<std::string>();
    else
      regex_ = std::make_unique<Regex>(p.at("Regex").get<std::string>(), "Replace decoder");
  }
  std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                        bool /*piece*/) const override {
    for (auto& t : tokens) {
      if (!regex_) {
        replace_all(t, literal_, content_);
        continue;
      }
      std::string out;
      size_t pos = 0;
      for (auto [b, e] : regex_->find_all(t)) {
        out.append(t, pos, b - pos).append(content_);
        pos = e;
      }
      t = out.append(t, pos);
    }
    return tokens;
  }

 private:
  std::string literal_, content_;
  std::unique_ptr<Regex> regex_;
};

class BpeSuffix final : public Decoder {
 public:
  explicit BpeSuffix(std::string suffix) : suffix_(std::move(suffix)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                        bool /*piece*/) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      replace_all(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
    return tokens;
  }

 private:
  std::string suffix_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens,
                                        bool piece) const override {
    for (const auto& p : parts_) tokens = p->decode_chain(std::move(tokens), piece);
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& c) {
  if (c.is_null()) return nullptr;
  const std::string type = c.at("type").get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Metaspace") {
    std::string scheme = c.value("prepend_scheme", "");
    if (scheme.empty()) scheme = c.value("add_prefix_space", true) ? "always" : "never";
    return std::make_unique<Metaspace>(c.value("replacement", "\xE2\x96\x81"), scheme != "never");
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip")
    return std::make_unique<Strip>(c.value("content", " "), c.value("start", 0),
                                   c.value("stop", 0));
  if (type == "Replace") return std::make_unique<Replace>(c);
  if (type == "BPEDecoder") return std::make_unique<BpeSuffix>(c.value("suffix", "</w>"));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& sub : c.at("decoders"))
      if (auto d = make_decoder(sub)) parts.push_back(std::move(d));
    return std::make_unique<Sequence>(std::move(parts));
  }
  throw LoadError(fmt::format("tokenizer.json: unsupported decoder type '{}'", type));
}

std::string clean_up_tokenization(std::string text) {
  constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) replace_all(text, from, to);
  return text;
}

}  // namespace serval::tokenizer
