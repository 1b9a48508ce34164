// Normalizers.
#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace serval::tokenizer {
namespace {

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(utf8proc_option_t options) : options_(options) {}
  std::string normalize(std::string_view text) const override {
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                static_cast<utf8proc_ssize_t>(text.size()), &out,
                                static_cast<utf8proc_option_t>(options_ | UTF8PROC_STABLE));
    if (n < 0) throw InvalidArgument(fmt::format("normalization failed: {}", utf8proc_errmsg(n)));
    std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
  }

 private:
  utf8proc_option_t options_;
};

class Lowercase final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();)
      utf8::append(out, static_cast<char32_t>(utf8proc_tolower(utf8::next(text, i))));
    return out;
  }
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view text) const override {
    size_t b = 0, e = text.size();
    if (left_) {
      while (b < e) {
        size_t p = b;
        if (!utf8::is_white_space(utf8::next(text, p))) break;
        b = p;
      }
    }
    if (right_) {
      while (e > b) {
        size_t s = e - 1;
        while (s > b && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        size_t p = s;
        if (!utf8::is_white_space(utf8::next(text, p))) break;
        e = s;
      }
    }
    return std::string(text.substr(b, e - b));
  }

 private:
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string_view text) const override {
    if (text.empty()) return {};
    return prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

class Replace final : public Normalizer {
 public:
  explicit Replace(const nlohmann::json& c) : content_(c.value("content", "")) {
    const auto& p = c.at("pattern");
    if (p.contains("String")) {
      literal_ = p.at("String").get<std::string>();
    } else {
      regex_ = std::make_unique<Regex>(p.at("Regex").get<std::string>(), "Replace normalizer");
    }
  }
  std::string normalize(std::string_view text) const override {
    std::string out;
    if (!regex_) {
      if (literal_.empty()) return std::string(text);
      size_t pos = 0;
      for (size_t hit; (hit = text.find(literal_, pos)) != std::string_view::npos;
           pos = hit + literal_.size())
        out.append(text.substr(pos, hit - pos)).append(content_);
      out.append(text.substr(pos));
      return out;
    }
    size_t pos = 0;
    for (auto [b, e] : regex_->find_all(text)) {
      out.append(text.substr(pos, b - pos)).append(content_);
      pos = e;
    }
    out.append(text.substr(pos));
    return out;
  }

 private:
  std::string literal_, content_;
  std::unique_ptr<Regex> regex_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& p : parts_) s = p->normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& c) {
  if (c.is_null()) return nullptr;
  const std::string type = c.at("type").get<std::string>();
  if (type == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_DECOMPOSE);
  if (type == "NFKC")
    return std::make_unique<UnicodeForm>(
        static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  if (type == "NFKD")
    return std::make_unique<UnicodeForm>(
        static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip")
    return std::make_unique<Strip>(c.value("strip_left", true), c.value("strip_right", true));
  if (type == "Prepend") return std::make_unique<Prepend>(c.at("prepend").get<std::string>());
  if (type == "Replace") return std::make_unique<Replace>(c);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& sub : c.at("normalizers"))
      if (auto n = make_normalizer(sub)) parts.push_back(std::move(n));
    return std::make_unique<Sequence>(std::move(parts));
  }
  throw LoadError(fmt::format("tokenizer.json: unsupported normalizer type '{}'", type));
}

}  // namespace serval::tokenizer
