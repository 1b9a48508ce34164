// Tokenizer: loading tokenizer.json / tokenizer_config.json, encode, decode.
#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace serval::tokenizer {

struct Tokenizer::Impl {
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  SpecialWrap wrap;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in `added`
  TokenMap added_by_content;
  std::unique_ptr<AddedTokenMatcher> raw_matcher, normalized_matcher;
  int32_t max_id = -1;

  std::string bos_token, eos_token, chat_template;
  bool clean_up_spaces = false;

  void encode_plain(std::string_view text, bool first_section, std::vector<int32_t>& out) const;
};

namespace {

std::string read_file(const std::string& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (required) throw LoadError(fmt::format("{}: cannot open file", path));
    return {};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A token field of tokenizer_config.json: "text", {"content": "text"} or null.
std::string token_string(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return it->at("content").get<std::string>();
  return {};
}

std::string chat_template_of(const nlohmann::json& config) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& entry : *it)
      if (entry.value("name", "") == "default") return entry.value("template", "");
  }
  return {};
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  const std::string tok_path = model_dir + "/tokenizer.json";
  const std::string cfg_path = model_dir + "/tokenizer_config.json";
  const std::string tok = read_file(tok_path, true);
  const std::string cfg = read_file(cfg_path, false);
  try {
    return from_json(tok, cfg);
  } catch (const LoadError& e) {
    throw LoadError(fmt::format("{}: {}", model_dir, e.what()));
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json,
                                                const std::string& tokenizer_config_json) {
  auto impl = std::make_unique<Impl>();
  nlohmann::json j, cfg;
  try {
    j = nlohmann::json::parse(tokenizer_json);
    if (!tokenizer_config_json.empty()) cfg = nlohmann::json::parse(tokenizer_config_json);
  } catch (const nlohmann::json::exception& e) {
    throw LoadError(fmt::format("tokenizer json does not parse: {}", e.what()));
  }
  try {
    auto field = [&](const char* key) { return j.contains(key) ? j.at(key) : nlohmann::json(); };
    impl->model = std::make_unique<BpeModel>(j.at("model"));
    impl->normalizer = make_normalizer(field("normalizer"));
    impl->pre_tokenizer = make_pre_tokenizer(field("pre_tokenizer"));
    impl->decoder = make_decoder(field("decoder"));
    impl->max_id = impl->model->max_id();

    std::vector<AddedTokenMatcher::Entry> raw, normalized;
    for (const auto& t : field("added_tokens")) {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      a.id = t.at("id").get<int32_t>();
      a.special = t.value("special", false);
      a.normalized = t.value("normalized", !a.special);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.single_word = t.value("single_word", false);
      utf8::validate(a.content, "added token content");
      impl->max_id = std::max(impl->max_id, a.id);
      if (a.normalized && impl->normalizer) {
        normalized.push_back(
            {impl->normalizer->normalize(a.content), a.id, a.lstrip, a.rstrip, a.single_word});
      } else {
        raw.push_back({a.content, a.id, a.lstrip, a.rstrip, a.single_word});
      }
      impl->added_by_id[a.id] = impl->added.size();
      impl->added_by_content[a.content] = a.id;
      impl->added.push_back(std::move(a));
    }
    impl->raw_matcher = std::make_unique<AddedTokenMatcher>(std::move(raw));
    impl->normalized_matcher = std::make_unique<AddedTokenMatcher>(std::move(normalized));

    Impl* p = impl.get();
    impl->wrap = make_special_wrap(
        field("post_processor"), [p](std::string_view s) -> std::optional<int32_t> {
          if (auto it = p->added_by_content.find(s); it != p->added_by_content.end())
            return it->second;
          return p->model->token_to_id(s);
        });
    if (cfg.is_object()) {
      impl->bos_token = token_string(cfg, "bos_token");
      impl->eos_token = token_string(cfg, "eos_token");
      impl->chat_template = chat_template_of(cfg);
      auto it = cfg.find("clean_up_tokenization_spaces");
      impl->clean_up_spaces = it != cfg.end() && it->is_boolean() && it->get<bool>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw LoadError(fmt::format("tokenizer.json is malformed: {}", e.what()));
  } catch (const InvalidArgument& e) {
    throw LoadError(fmt::format("tokenizer.json is malformed: {}", e.what()));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

void Tokenizer::Impl::encode_plain(std::string_view text, bool first_section,
                                   std::vector<int32_t>& out) const {
  const std::string norm = normalizer ? normalizer->normalize(text) : std::string(text);
  bool first = first_section;
  for (const auto& span : normalized_matcher->split(norm)) {
    if (span.id >= 0) {
      out.push_back(span.id);
      first = false;
      continue;
    }
    std::vector<std::string> words{std::string(norm.substr(span.begin, span.end - span.begin))};
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(words, first);
    for (const auto& w : words)
      if (!w.empty()) model->tokenize(w, out);
    first = false;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  utf8::validate(text);
  std::vector<int32_t> out;
  if (add_special_tokens) out = impl_->wrap.before;
  for (const auto& span : impl_->raw_matcher->split(text)) {
    if (span.id >= 0)
      out.push_back(span.id);
    else
      impl_->encode_plain(text.substr(span.begin, span.end - span.begin), span.begin == 0, out);
  }
  if (add_special_tokens) out.insert(out.end(), impl_->wrap.after.begin(), impl_->wrap.after.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens,
                              bool clean_up_spaces) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
      const AddedToken& a = impl_->added[it->second];
      if (!(skip_special_tokens && a.special)) tokens.push_back(a.content);
      continue;
    }
    const std::string* t = impl_->model->id_to_token(id);
    if (!t)
      throw InvalidArgument(
          fmt::format("token id {} at position {} is outside the vocabulary "
                      "(size {})",
                      id, i, vocab_size()));
    tokens.push_back(*t);
  }
  std::string text = join_decoded(std::move(tokens), /*piece=*/false);
  return clean_up_spaces ? clean_up_tokenization(std::move(text)) : text;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end())
    return impl_->added[it->second].content;
  const std::string* t = impl_->model->id_to_token(id);
  if (!t)
    throw InvalidArgument(
        fmt::format("token id {} is outside the vocabulary (size {})", id, vocab_size()));
  return join_decoded({*t}, /*piece=*/true);
}

std::string Tokenizer::join_decoded(std::vector<std::string> tokens, bool piece) const {
  std::string text;
  if (impl_->decoder) {
    for (const auto& piece : impl_->decoder->decode_chain(std::move(tokens), piece)) text += piece;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return text;
}

int Tokenizer::vocab_size() const {
  return impl_->max_id + 1;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end())
    return it->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end())
    return impl_->added[it->second].content;
  const std::string* t = impl_->model->id_to_token(id);
  return t ? *t : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

const std::string& Tokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_token;
}
const std::string& Tokenizer::chat_template_source() const {
  return impl_->chat_template;
}
bool Tokenizer::clean_up_tokenization_spaces() const {
  return impl_->clean_up_spaces;
}

std::optional<int32_t> Tokenizer::eos_token_id() const {
  if (impl_->eos_token.empty()) return std::nullopt;
  return token_to_id(impl_->eos_token);
}

std::optional<int32_t> Tokenizer::bos_token_id() const {
  if (impl_->bos_token.empty()) return std::nullopt;
  return token_to_id(impl_->bos_token);
}

}  // namespace serval::tokenizer
