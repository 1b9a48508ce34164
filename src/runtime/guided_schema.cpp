#include "runtime/guided_schema.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "base/error.h"
#include "base/json_depth.h"
#include "runtime/engine.h"

namespace serval::runtime {

namespace {

using Json = nlohmann::json;
using Kind = SchemaNode::Kind;

// Deeper schema texts are refused before parsing: the compiler recurses along the nesting.
constexpr int kMaxSchemaDepth = 64;

// Keywords that only describe: skipped wherever they appear. (OpenAPI's "discriminator" names
// the property that tells a oneOf's alternatives apart; the alternatives themselves constrain.)
const std::set<std::string_view> kAnnotations = {
    "title",      "description", "default",   "examples", "$schema",     "$id",    "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "strict", "discriminator"};
const std::set<std::string_view> kHandled = {"type",
                                             "properties",
                                             "required",
                                             "additionalProperties",
                                             "items",
                                             "minItems",
                                             "maxItems",
                                             "enum",
                                             "const",
                                             "anyOf",
                                             "oneOf",
                                             "$ref",
                                             "allOf",
                                             "prefixItems",
                                             "pattern",
                                             "format",
                                             "minLength",
                                             "maxLength",
                                             "minimum",
                                             "maximum",
                                             "exclusiveMinimum",
                                             "exclusiveMaximum",
                                             "multipleOf",
                                             "uniqueItems"};

// String formats written as patterns (anchored). JSON Schema's format is an assertion only when
// a validator opts in; these give the shape (digit counts, separators), not calendar validity.
const std::map<std::string_view, std::string_view> kFormatPatterns = {
    {"date", R"(^\d{4}-\d{2}-\d{2}$)"},
    {"time", R"(^\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})?$)"},
    {"date-time", R"(^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,3})?(Z|[+-]\d{2}:\d{2})$)"},
    {"uuid", R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)"},
    {"ipv4", R"(^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$)"},
    {"email", R"(^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$)"},
    {"uri", R"(^[A-Za-z][A-Za-z0-9+.-]*:[^\s]+$)"},
    {"hostname",
     R"(^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$)"},
};

bool plain_key(std::string_view name) {
  for (unsigned char c : name)
    if (c == '"' || c == '\\' || c < 0x20) return false;
  return true;
}

bool is_number_start(unsigned char c) {
  return c == '-' || (c >= '0' && c <= '9');
}

bool can_begin(const SchemaNode& node, unsigned char c, int depth) {
  switch (node.kind) {
    case Kind::kAny:
      return c == '{' || c == '[' || c == '"' || c == 't' || c == 'f' || c == 'n' ||
             is_number_start(c);
    case Kind::kObject:
    case Kind::kToolCall:
      return c == '{';
    case Kind::kArray:
      return c == '[';
    case Kind::kString:
      return c == '"';
    case Kind::kNumber:
    case Kind::kInteger:
      return is_number_start(c);
    case Kind::kBoolean:
      return c == 't' || c == 'f';
    case Kind::kNull:
      return c == 'n';
    case Kind::kLiterals:
      for (const std::string& l : node.literals)
        if (static_cast<unsigned char>(l[0]) == c) return true;
      return false;
    case Kind::kRegex:
      return false;
    case Kind::kAnyOf:
      if (depth > 16) throw InvalidArgument("anyOf nests itself without a value in between");
      for (const SchemaNode* a : node.alternatives)
        if (can_begin(*a, c, depth + 1)) return true;
      return false;
  }
  return false;
}

}  // namespace

bool value_can_begin(const SchemaNode& node, unsigned char c) {
  return can_begin(node, c, 0);
}

// Compiles one schema document; "$ref"s resolve into its "$defs" / "definitions" once each (a
// node is registered before its body compiles, so recursive references close the loop).
class SchemaCompiler {
 public:
  SchemaCompiler(JsonGrammar& g, const Json& root) : g_(g), root_(root) {}

  // Call once, after compile(): throws for an anyOf that nests itself without a value between.
  void check_pending_any_of() const {
    for (const auto& [n, at] : pending_any_of_) check_first_chars_resolve(*n, at);
  }

  const SchemaNode* compile(const Json& s, const std::string& at) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(at, "the schema false matches nothing");
      return add(SchemaNode{});
    }
    if (!s.is_object()) fail(at, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key) || kHandled.count(key)) continue;
      fail(at + "/" + key,
           fmt::format("the keyword '{}' is not supported by guided decoding", key));
    }
    if (auto all = s.find("allOf"); all != s.end()) return all_of(s, *all, at);
    if (auto ref = s.find("$ref"); ref != s.end()) return compile_ref(*ref, at + "/$ref");
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) fail(at + "/enum", "must be a non-empty list");
      return literals(*e, at + "/enum");
    }
    if (auto c = s.find("const"); c != s.end()) return literals(Json::array({*c}), at + "/const");
    for (const char* key : {"anyOf", "oneOf"})
      if (auto alts = s.find(key); alts != s.end()) return any_of(*alts, at + "/" + key);
    auto type = s.find("type");
    if (type == s.end()) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        return typed(s, "object", at);
      for (const char* key : {"items", "prefixItems", "minItems", "maxItems"})
        if (s.contains(key)) return typed(s, "array", at);
      for (const char* key : {"pattern", "format", "minLength", "maxLength"})
        if (s.contains(key)) return typed(s, "string", at);
      for (const char* key :
           {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
        if (s.contains(key)) return typed(s, "number", at);
      return add(SchemaNode{});
    }
    if (type->is_string()) return typed(s, type->get<std::string>(), at);
    if (!type->is_array() || type->empty())
      fail(at + "/type", "must be a type name or a non-empty list of them");
    SchemaNode alts;
    alts.kind = Kind::kAnyOf;
    for (const Json& t : *type) {
      if (!t.is_string()) fail(at + "/type", "must list type names");
      alts.alternatives.push_back(typed(s, t.get<std::string>(), at));
    }
    return check_any_of(add(std::move(alts)), at + "/type");
  }

 private:
  [[noreturn]] static void fail(const std::string& at, const std::string& what) {
    throw InvalidArgument(fmt::format("schema at '{}': {}", at.empty() ? "/" : at, what));
  }

  SchemaNode* add(SchemaNode n) { return &g_.nodes_.emplace_back(std::move(n)); }

  const SchemaNode* compile_ref(const Json& ref, const std::string& at) {
    if (!ref.is_string()) fail(at, "must be a string");
    const std::string r = ref.get<std::string>();
    if (auto done = refs_.find(r); done != refs_.end()) return done->second;
    const Json* target = nullptr;
    for (std::string_view prefix : {"#/$defs/", "#/definitions/"}) {
      if (!r.starts_with(prefix)) continue;
      const std::string defs(prefix.substr(2, prefix.size() - 3)), name = r.substr(prefix.size());
      if (root_.contains(defs) && root_[defs].is_object() && root_[defs].contains(name))
        target = &root_[defs][name];
    }
    if (!target) fail(at, fmt::format("'{}' does not name an entry of $defs or definitions", r));
    // Registered first: a definition that refers to itself gets this node back.
    SchemaNode* node = add(SchemaNode{});
    refs_[r] = node;
    unfinished_.insert(node);
    const SchemaNode* body = compile(*target, r.substr(1));
    // A body that is itself an unfinished definition: references (and allOf wrappers) in a
    // cycle with no value between them, which describe nothing.
    if (unfinished_.count(body))
      fail(at, fmt::format("'{}' leads back to itself through references alone", r));
    *node = *body;
    unfinished_.erase(node);
    return node;
  }

  const SchemaNode* literals(const Json& values, const std::string& at) {
    if (values.size() > size_t(kMaxLiterals))
      fail(at, fmt::format("at most {} values are supported", kMaxLiterals));
    SchemaNode n;
    n.kind = Kind::kLiterals;
    for (const Json& v : values) {
      if (v.is_object() || v.is_array()) fail(at, "only strings, numbers, booleans and null");
      n.literals.push_back(v.dump());
    }
    return add(std::move(n));
  }

  const SchemaNode* any_of(const Json& alts, const std::string& at) {
    if (!alts.is_array() || alts.empty()) fail(at, "must be a non-empty list of schemas");
    if (alts.size() == 1) return compile(alts[0], at + "/0");
    SchemaNode n;
    n.kind = Kind::kAnyOf;
    for (size_t i = 0; i < alts.size(); ++i)
      n.alternatives.push_back(compile(alts[i], at + "/" + std::to_string(i)));
    return check_any_of(add(std::move(n)), at);
  }

  // Checked by check_pending_any_of once everything is compiled (a "$ref" being compiled has no
  // kind yet).
  const SchemaNode* check_any_of(const SchemaNode* n, const std::string& at) {
    pending_any_of_.emplace_back(n, at);
    return n;
  }

  // An anyOf that reaches itself without a value in between would loop the matcher: refused
  // (value_can_begin throws on it).
  static void check_first_chars_resolve(const SchemaNode& n, const std::string& at) {
    try {
      for (int c = 0; c < 256; ++c)
        for (const SchemaNode* a : n.alternatives) value_can_begin(*a, uint8_t(c));
    } catch (const InvalidArgument& e) {
      fail(at, e.what());
    }
  }

  const SchemaNode* typed(const Json& s, const std::string& type, const std::string& at) {
    SchemaNode n;
    if (type == "string") {
      n.kind = Kind::kString;
      string_constraints(s, at, n);
    } else if (type == "number") {
      n.kind = Kind::kNumber;
      number_bounds(s, at, n);
    } else if (type == "integer") {
      n.kind = Kind::kInteger;
      integer_bounds(s, at, n);
    } else if (type == "boolean") {
      n.kind = Kind::kBoolean;
    } else if (type == "null") {
      n.kind = Kind::kNull;
    } else if (type == "object") {
      return object(s, at);
    } else if (type == "array") {
      return array(s, at);
    } else {
      fail(at + "/type", fmt::format("unknown type '{}'", type));
    }
    return add(std::move(n));
  }

  // A non-negative integer keyword of `s` (minLength, maxItems, …), or `fallback` when absent.
  static int64_t count(const Json& s, const char* key, const std::string& at, int64_t fallback) {
    const auto v = s.find(key);
    if (v == s.end()) return fallback;
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      fail(at + "/" + key, "must be a non-negative integer");
    return v->get<int64_t>();
  }

  void string_constraints(const Json& s, const std::string& at, SchemaNode& n) {
    const auto pattern = s.find("pattern"), format = s.find("format");
    if (pattern != s.end() && format != s.end())
      fail(at + "/format", "a string with both a pattern and a format is not supported");
    if (pattern != s.end()) n.regex = string_pattern(*pattern, at + "/pattern");
    if (format != s.end()) {
      const auto known = format->is_string() ? kFormatPatterns.find(format->get<std::string>())
                                             : kFormatPatterns.end();
      if (known == kFormatPatterns.end())
        fail(at + "/format",
             fmt::format("format {} is not supported (date, time, date-time, uuid, ipv4, email, "
                         "uri, hostname)",
                         format->dump()));
      n.regex = string_pattern(Json(std::string(known->second)), at + "/format");
    }
    n.min_length = count(s, "minLength", at, 0);
    n.max_length = count(s, "maxLength", at, -1);
    if (n.max_length >= 0 && n.max_length < n.min_length)
      fail(at + "/maxLength", "is below minLength");
  }

  // Calls take(value, lower, exclusive, key) for each of minimum / maximum (inclusive) and
  // exclusiveMinimum / exclusiveMaximum present (numbers, as from draft 6 on; draft 4's booleans
  // are refused).
  template <class Take>
  static void each_bound(const Json& s, const std::string& at, Take take) {
    static constexpr struct {
      const char* key;
      bool lower, exclusive;
    } kBounds[] = {{"minimum", true, false},
                   {"exclusiveMinimum", true, true},
                   {"maximum", false, false},
                   {"exclusiveMaximum", false, true}};
    for (const auto& b : kBounds) {
      const auto v = s.find(b.key);
      if (v == s.end()) continue;
      if (!v->is_number()) fail(at + "/" + b.key, "must be a number");
      take(v->template get<double>(), b.lower, b.exclusive, b.key);
    }
  }

  // An integer's bounds, tightened to one 64-bit range.
  static void integer_bounds(const Json& s, const std::string& at, SchemaNode& n) {
    n.minimum = std::numeric_limits<int64_t>::min();
    n.maximum = std::numeric_limits<int64_t>::max();
    each_bound(s, at, [&](double d, bool lower, bool exclusive, const char* key) {
      if (!(std::fabs(d) < 9.2e18)) fail(at + "/" + key, "is beyond the 64-bit integers");
      // The nearest integer inside the bound.
      const double inside = lower ? (exclusive ? std::floor(d) + 1 : std::ceil(d))
                                  : (exclusive ? std::ceil(d) - 1 : std::floor(d));
      const auto i = static_cast<int64_t>(inside);
      if (lower)
        n.minimum = std::max(n.minimum, i);
      else
        n.maximum = std::min(n.maximum, i);
      n.bounded = true;
    });
    if (const auto m = s.find("multipleOf"); m != s.end()) {
      const double k = m->is_number() ? m->get<double>() : 0;
      if (!(k >= 1 && k < 4e18 && k == std::floor(k)))
        fail(at + "/multipleOf", "must be a positive whole number on an integer");
      n.multiple_of = static_cast<int64_t>(k);
      n.bounded = true;
    }
    if (n.minimum > n.maximum) fail(at, "no integer lies within the bounds");
  }

  // A number's bounds, kept as doubles, each end open for an exclusive bound.
  static void number_bounds(const Json& s, const std::string& at, SchemaNode& n) {
    if (s.contains("multipleOf"))
      fail(at + "/multipleOf", "multipleOf is supported on integers only");
    n.number_min = -std::numeric_limits<double>::infinity();
    n.number_max = std::numeric_limits<double>::infinity();
    each_bound(s, at, [&](double d, bool lower, bool exclusive, const char*) {
      double& end = lower ? n.number_min : n.number_max;
      bool& open = lower ? n.min_open : n.max_open;
      if ((lower ? d > end : d < end) || (d == end && exclusive)) {
        end = d;
        open = exclusive;
      }
      n.bounded = true;
    });
    if (n.number_min > n.number_max || (n.number_min == n.number_max && (n.min_open || n.max_open)))
      fail(at, "no number lies within the bounds");
  }

  // JSON Schema's pattern is a search: unless anchored, anything may come before and after.
  const RegexAutomaton* string_pattern(const Json& p, const std::string& at) {
    if (!p.is_string()) fail(at, "must be a string");
    std::string pattern = p.get<std::string>();
    const bool starts = pattern.starts_with('^'), ends = pattern.ends_with('$');
    if (starts) pattern.erase(0, 1);
    if (ends) pattern.pop_back();
    pattern = (starts ? "" : ".*") + ("(?:" + pattern + ")") + (ends ? "" : ".*");
    try {
      return &g_.regexes_.emplace_back(compile_regex(pattern));
    } catch (const InvalidArgument& e) {
      fail(at, e.what());
    }
  }

  // allOf of one schema (as Pydantic wraps a described $ref) is that schema; beside it only
  // annotations. An intersection of several is refused.
  const SchemaNode* all_of(const Json& s, const Json& all, const std::string& at) {
    if (!all.is_array() || all.size() != 1)
      fail(at + "/allOf", "only an allOf of one schema is supported");
    for (const auto& [key, value] : s.items())
      if (key != "allOf" && !kAnnotations.count(key))
        fail(at + "/" + key, fmt::format("'{}' beside allOf is not supported", key));
    return compile(all[0], at + "/allOf/0");
  }

  const SchemaNode* object(const Json& s, const std::string& at) {
    SchemaNode* n = add(SchemaNode{});
    n->kind = Kind::kObject;
    if (auto props = s.find("properties"); props != s.end()) {
      if (!props->is_object()) fail(at + "/properties", "must be an object");
      if (props->size() > size_t(kMaxProperties))
        fail(at + "/properties",
             fmt::format("at most {} properties are supported", kMaxProperties));
      for (const auto& [name, sub] : props->items()) {
        if (!plain_key(name))
          fail(at + "/properties",
               fmt::format("property names with quotes, backslashes or control characters are "
                           "not supported ('{}')",
                           name));
        n->properties.push_back({name, compile(sub, at + "/properties/" + name), false});
      }
    }
    if (auto add_props = s.find("additionalProperties"); add_props != s.end()) {
      if (add_props->is_boolean()) {
        n->additional_properties = add_props->get<bool>();
      } else if (add_props->is_object()) {
        n->additional_properties = true;
        if (!add_props->empty())
          n->additional_values = compile(*add_props, at + "/additionalProperties");
      } else {
        fail(at + "/additionalProperties", "must be a boolean or a schema");
      }
    }
    if (auto req = s.find("required"); req != s.end()) {
      if (!req->is_array()) fail(at + "/required", "must be a list of property names");
      for (const Json& name : *req) {
        if (!name.is_string()) fail(at + "/required", "must be a list of property names");
        bool found = false;
        for (SchemaProperty& p : n->properties)
          if (p.name == name.get<std::string>()) p.required = found = true;
        if (!found)
          fail(at + "/required", fmt::format("'{}' is required but not among the properties",
                                             name.get<std::string>()));
      }
    }
    return n;
  }

  const SchemaNode* array(const Json& s, const std::string& at) {
    SchemaNode n;
    n.kind = Kind::kArray;
    n.min_items = count(s, "minItems", at, 0);
    n.max_items = count(s, "maxItems", at, -1);
    if (auto prefix = s.find("prefixItems"); prefix != s.end()) {
      if (!prefix->is_array()) fail(at + "/prefixItems", "must be a list of schemas");
      for (size_t i = 0; i < prefix->size(); ++i)
        n.prefix_items.push_back(compile((*prefix)[i], fmt::format("{}/prefixItems/{}", at, i)));
    }
    if (const auto unique = s.find("uniqueItems"); unique != s.end()) {
      if (!unique->is_boolean()) fail(at + "/uniqueItems", "must be a boolean");
      n.unique_items = unique->get<bool>();
    }
    if (auto items = s.find("items"); items != s.end()) {
      if (items->is_boolean() && !items->get<bool>()) {  // nothing past prefixItems
        const auto most = int64_t(n.prefix_items.size());
        n.max_items = n.max_items < 0 ? most : std::min(n.max_items, most);
      } else {
        n.items = compile(*items, at + "/items");
      }
    }
    if (n.max_items >= 0 && n.max_items < n.min_items) fail(at + "/maxItems", "is below minItems");
    if (n.unique_items && (!n.items || n.items->kind != Kind::kLiterals || !n.prefix_items.empty()))
      fail(at + "/uniqueItems", "uniqueItems is supported on arrays of enum / const items only");
    return add(std::move(n));
  }

  JsonGrammar& g_;
  const Json& root_;
  std::map<std::string, const SchemaNode*> refs_;
  std::set<const SchemaNode*> unfinished_;  // definitions whose bodies are being compiled
  std::vector<std::pair<const SchemaNode*, std::string>> pending_any_of_;
};

std::shared_ptr<const JsonGrammar> json_object_grammar() {
  return JsonGrammar::any_object();
}

std::shared_ptr<const JsonGrammar> choice_grammar(const std::vector<std::string>& choices) {
  return JsonGrammar::choice(choices);
}

std::shared_ptr<const JsonGrammar> regex_grammar(const std::string& pattern) {
  return JsonGrammar::regex(pattern);
}

std::shared_ptr<const JsonGrammar> gbnf_grammar(const std::string& text) {
  return JsonGrammar::grammar(text);
}

// A schema's JSON text, parsed once its nesting is known to be shallow enough to compile.
nlohmann::json parse_schema_text(const std::string& text, const std::string& what) {
  if (json_nesting_depth(text, kMaxSchemaDepth) > kMaxSchemaDepth)
    throw InvalidArgument(fmt::format("{} nests deeper than {} levels", what, kMaxSchemaDepth));
  nlohmann::json schema = nlohmann::json::parse(text, nullptr, false);
  if (schema.is_discarded()) throw InvalidArgument(what + " is not valid JSON");
  return schema;
}

std::shared_ptr<const JsonGrammar> tool_calls_grammar(
    const std::vector<std::pair<std::string, std::string>>& tools, int max_calls) {
  std::vector<std::pair<std::string, nlohmann::json>> parsed;
  for (const auto& [name, schema_json] : tools)
    parsed.emplace_back(name, parse_schema_text(schema_json, "the parameters of '" + name + "'"));
  return JsonGrammar::tool_calls(parsed, max_calls);
}

std::shared_ptr<const JsonGrammar> json_schema_grammar(const std::string& schema_json) {
  return JsonGrammar::from_schema(parse_schema_text(schema_json, "the JSON schema"));
}

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  auto g = std::make_shared<JsonGrammar>();
  SchemaNode obj;
  obj.kind = Kind::kObject;
  obj.additional_properties = true;
  g->root_ = &g->nodes_.emplace_back(std::move(obj));
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::tool_calls(
    const std::vector<std::pair<std::string, nlohmann::json>>& tools, int max_calls) {
  if (tools.empty() || tools.size() > size_t(kMaxLiterals))
    throw InvalidArgument(fmt::format("between 1 and {} tools are supported", kMaxLiterals));
  auto g = std::make_shared<JsonGrammar>();
  SchemaNode names, call;
  names.kind = Kind::kLiterals;
  call.kind = Kind::kToolCall;
  for (const auto& [name, parameters] : tools) {
    SchemaCompiler compiler(*g, parameters);
    names.literals.push_back(Json(name).dump());
    call.alternatives.push_back(compiler.compile(parameters, "/" + name));
    compiler.check_pending_any_of();
  }
  call.tool_names = &g->nodes_.emplace_back(std::move(names));
  SchemaNode list;
  list.kind = Kind::kArray;
  list.min_items = 1;
  list.max_items = max_calls;
  list.items = &g->nodes_.emplace_back(std::move(call));
  g->root_ = &g->nodes_.emplace_back(std::move(list));
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::choice(const std::vector<std::string>& choices) {
  if (choices.empty() || choices.size() > size_t(kMaxLiterals))
    throw InvalidArgument(fmt::format("between 1 and {} choices are supported", kMaxLiterals));
  SchemaNode n;
  n.kind = Kind::kLiterals;
  for (const std::string& c : choices) {
    if (c.empty()) throw InvalidArgument("a choice must not be empty");
    n.literals.push_back(c);
  }
  auto g = std::make_shared<JsonGrammar>();
  g->root_ = &g->nodes_.emplace_back(std::move(n));
  g->output_ = Output::kChoice;
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::regex(std::string_view pattern) {
  auto g = std::make_shared<JsonGrammar>();
  SchemaNode n;
  n.kind = Kind::kRegex;
  n.regex = &g->regexes_.emplace_back(compile_regex(pattern));
  g->root_ = &g->nodes_.emplace_back(std::move(n));
  g->output_ = Output::kRegex;
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::grammar(std::string_view text) {
  auto g = std::make_shared<JsonGrammar>();
  g->gbnf_ = compile_gbnf(text);
  g->output_ = Output::kGrammar;
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::from_schema(const nlohmann::json& schema) {
  auto g = std::make_shared<JsonGrammar>();
  SchemaCompiler compiler(*g, schema);
  g->root_ = compiler.compile(schema, "");
  compiler.check_pending_any_of();
  return g;
}

}  // namespace serval::runtime
