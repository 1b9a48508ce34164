#include "server/config_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string_view>

#include "base/error.h"

#if SERVAL_HAVE_YAML
#include <yaml.h>
#endif

namespace serval::server {

#if SERVAL_HAVE_YAML

namespace {

using OrderedJson = nlohmann::ordered_json;
constexpr int kMaxDepth = 32;  // nested mappings in a flag's value

bool one_of(std::string_view s, std::initializer_list<std::string_view> words) {
  return std::ranges::find(words, s) != words.end();
}

// A plain (unquoted) scalar as YAML 1.1 resolves it, as PyYAML's safe_load does.
OrderedJson plain_scalar(std::string_view s) {
  if (one_of(s, {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"})) return true;
  if (one_of(s, {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"})) return false;
  if (one_of(s, {"", "~", "null", "Null", "NULL"})) return nullptr;
  int64_t i = 0;
  const char* end = s.data() + s.size();
  const char* first = s.data() + (s.starts_with('+') ? 1 : 0);
  if (auto r = std::from_chars(first, end, i); r.ec == std::errc() && r.ptr == end) return i;
  if (s.find_first_of(".eE") != std::string_view::npos) {
    double d = 0;
    if (auto r = std::from_chars(first, end, d); r.ec == std::errc() && r.ptr == end) return d;
  }
  return std::string(s);
}

// Owns a parsed YAML document.
class YamlDocument {
 public:
  explicit YamlDocument(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) throw InvalidArgument(fmt::format("--config {}: cannot open the file", path));
    yaml_parser_initialize(&parser_);
    yaml_parser_set_input_file(&parser_, file_);
    if (!yaml_parser_load(&parser_, &doc_)) {
      const std::string problem = parser_.problem ? parser_.problem : "not YAML";
      const size_t line = parser_.problem_mark.line + 1;
      release();
      throw InvalidArgument(fmt::format("--config {}: line {}: {}", path, line, problem));
    }
    loaded_ = true;
  }
  ~YamlDocument() { release(); }
  YamlDocument(const YamlDocument&) = delete;
  YamlDocument& operator=(const YamlDocument&) = delete;

  yaml_node_t* root() { return yaml_document_get_root_node(&doc_); }
  yaml_node_t* node(int index) { return yaml_document_get_node(&doc_, index); }

  [[noreturn]] void fail(const yaml_node_t* at, std::string_view what) const {
    throw InvalidArgument(
        fmt::format("--config {}: line {}: {}", path_, at->start_mark.line + 1, what));
  }

 private:
  void release() {
    if (loaded_) yaml_document_delete(&doc_);
    loaded_ = false;
    yaml_parser_delete(&parser_);
    if (file_) std::fclose(file_);
    file_ = nullptr;
  }

  std::string path_;
  std::FILE* file_ = nullptr;
  yaml_parser_t parser_{};
  yaml_document_t doc_{};
  bool loaded_ = false;
};

std::string scalar_text(const yaml_node_t* n) {
  return std::string(reinterpret_cast<const char*>(n->data.scalar.value), n->data.scalar.length);
}

bool plain(const yaml_node_t* n) {
  return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

// A mapping's value as JSON (a flag such as --hf-overrides takes it as JSON text).
OrderedJson to_json(YamlDocument& doc, yaml_node_t* n, int depth) {
  if (depth > kMaxDepth) doc.fail(n, fmt::format("nested deeper than {} levels", kMaxDepth));
  switch (n->type) {
    case YAML_SCALAR_NODE:
      return plain(n) ? plain_scalar(scalar_text(n)) : OrderedJson(scalar_text(n));
    case YAML_SEQUENCE_NODE: {
      OrderedJson a = OrderedJson::array();
      for (yaml_node_item_t* it = n->data.sequence.items.start; it < n->data.sequence.items.top;
           ++it)
        a.push_back(to_json(doc, doc.node(*it), depth + 1));
      return a;
    }
    case YAML_MAPPING_NODE: {
      OrderedJson o = OrderedJson::object();
      for (yaml_node_pair_t* p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; ++p) {
        yaml_node_t* key = doc.node(p->key);
        if (key->type != YAML_SCALAR_NODE) doc.fail(key, "a mapping key must be a plain name");
        o[scalar_text(key)] = to_json(doc, doc.node(p->value), depth + 1);
      }
      return o;
    }
    default:
      doc.fail(n, "an empty node");
  }
}

}  // namespace

std::vector<std::vector<std::string>> config_file_flags(const std::string& path,
                                                        bool (*no_form)(const std::string& flag)) {
  YamlDocument doc(path);
  std::vector<std::vector<std::string>> flags;
  yaml_node_t* root = doc.root();
  if (root == nullptr) return flags;  // an empty file
  if (root->type != YAML_MAPPING_NODE) doc.fail(root, "expected a mapping of flag names to values");
  for (yaml_node_pair_t* p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
       ++p) {
    yaml_node_t* key = doc.node(p->key);
    yaml_node_t* value = doc.node(p->value);
    if (key->type != YAML_SCALAR_NODE) doc.fail(key, "a flag name must be a plain name");
    std::string name = scalar_text(key);
    name.erase(0, name.find_first_not_of('-'));
    std::ranges::replace(name, '_', '-');
    if (name.empty()) doc.fail(key, "an empty flag name");
    const std::string flag = "--" + name;
    if (value->type == YAML_SCALAR_NODE) {
      const OrderedJson v = plain(value) ? plain_scalar(scalar_text(value)) : OrderedJson();
      if (v.is_boolean()) {
        if (v.get<bool>())
          flags.push_back({flag});
        else if (no_form("--no-" + name))
          flags.push_back({"--no-" + name});
        continue;
      }
      if (plain(value) && v.is_null()) continue;  // `key:` or `key: null`: the default
      flags.push_back({flag, scalar_text(value)});
    } else if (value->type == YAML_SEQUENCE_NODE) {
      std::vector<std::string> group = {flag};
      for (yaml_node_item_t* it = value->data.sequence.items.start;
           it < value->data.sequence.items.top; ++it) {
        yaml_node_t* item = doc.node(*it);
        if (item->type != YAML_SCALAR_NODE)
          doc.fail(item, "a list of " + flag +
                             " values holds a "
                             "list or a mapping");
        group.push_back(scalar_text(item));
      }
      flags.push_back(std::move(group));
    } else {
      flags.push_back({flag, to_json(doc, value, 0).dump()});
    }
  }
  return flags;
}

#else  // built without libyaml

std::vector<std::vector<std::string>> config_file_flags(const std::string& path,
                                                        bool (*)(const std::string&)) {
  throw InvalidArgument(fmt::format(
      "--config {}: this serval was built without libyaml (install libyaml-dev and rebuild)",
      path));
}

#endif

}  // namespace serval::server
