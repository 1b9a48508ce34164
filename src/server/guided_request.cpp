// Guided decoding fields of a request (vLLM's structured outputs) → the sampling grammar.
#include "server/guided_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "server/api_error.h"

namespace serval::server {

namespace {

// vLLM's guided_choice: a list of strings, one of which is the whole output.
std::shared_ptr<const runtime::JsonGrammar> choice_grammar(const Json& choices, const char* param) {
  if (!choices.is_array()) throw bad_request(param, "the choices must be a list of strings");
  std::vector<std::string> list;
  for (const Json& c : choices) {
    if (!c.is_string()) throw bad_request(param, "the choices must be a list of strings");
    list.push_back(c.get<std::string>());
  }
  return grammar_or_400(param, [&] { return runtime::choice_grammar(list); });
}

// vLLM's guided_regex: the whole output matches the pattern.
std::shared_ptr<const runtime::JsonGrammar> regex_grammar(const Json& pattern, const char* param) {
  if (!pattern.is_string()) throw bad_request(param, "the regex must be a string");
  return grammar_or_400(param, [&] { return runtime::regex_grammar(pattern.get<std::string>()); });
}

std::shared_ptr<const runtime::JsonGrammar> parse_response_format(const Json& rf) {
  if (!rf.is_object())
    throw bad_request("response_format", "'response_format' must be an object with a 'type'");
  const auto type = rf.find("type");
  if (type == rf.end() || !type->is_string())
    throw bad_request("response_format", "'response_format' needs a string 'type'");
  const std::string t = type->get<std::string>();
  if (t == "text") return nullptr;
  if (t == "json_object") return runtime::json_object_grammar();
  if (t != "json_schema")
    throw bad_request("response_format",
                      fmt::format("response_format type '{}' is not supported (text, json_object, "
                                  "json_schema)",
                                  t));
  const auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object() || !js->contains("schema"))
    throw bad_request("response_format",
                      "a json_schema response_format needs 'json_schema': {'name', 'schema'}");
  return compile_schema((*js)["schema"], "response_format");
}

// vLLM's guided_grammar: a GBNF grammar (guided_gbnf.h) the whole output is a sentence of.
std::shared_ptr<const runtime::JsonGrammar> gbnf_grammar(const Json& text, const char* param) {
  if (!text.is_string()) throw bad_request(param, "the grammar must be a string (GBNF)");
  return grammar_or_400(param, [&] { return runtime::gbnf_grammar(text.get<std::string>()); });
}

// structured_outputs' options beside the constraint: disable_any_whitespace (compact JSON),
// disable_fallback (serval has no other backend to fall back to) and
// disable_additional_properties (true is serval's reading of a schema anyway).
bool is_structured_outputs_option(const std::string& key, const Json& value,
                                  runtime::SamplingParams& s) {
  if (key != "disable_any_whitespace" && key != "disable_fallback" &&
      key != "disable_additional_properties")
    return false;
  if (!value.is_boolean())
    throw bad_request("structured_outputs", "structured_outputs." + key + " must be a boolean");
  if (key == "disable_any_whitespace") s.guided_compact_json = value.get<bool>();
  if (key == "disable_additional_properties" && !value.get<bool>())
    throw bad_request("structured_outputs",
                      "disable_additional_properties false is not supported: schemas without "
                      "additionalProperties allow no other keys here");
  return true;
}

}  // namespace

std::shared_ptr<const runtime::JsonGrammar> compile_schema(const Json& schema, const char* param) {
  if (!schema.is_string() && !schema.is_object() && !schema.is_boolean())
    throw bad_request(param, "the JSON schema must be an object (or its JSON text)");
  return grammar_or_400(param, [&] {
    return runtime::json_schema_grammar(schema.is_string() ? schema.get<std::string>()
                                                           : schema.dump());
  });
}

// vLLM's guided_* fields and the structured_outputs keys of the same constraints.
struct GuidedField {
  const char* field;
  const char* structured_key;
  std::shared_ptr<const runtime::JsonGrammar> (*make)(const Json& value, const char* param);
};
constexpr GuidedField kGuidedFields[] = {
    {"guided_json", "json", compile_schema},
    {"guided_choice", "choice", choice_grammar},
    {"guided_regex", "regex", regex_grammar},
    {"guided_grammar", "grammar", gbnf_grammar},
};

void parse_guided_decoding(const Json& body, runtime::SamplingParams& s) {
  std::shared_ptr<const runtime::JsonGrammar> grammar;
  int sources = 0;
  if (const Json* rf = field(body, "response_format")) {
    grammar = parse_response_format(*rf);
    sources += grammar != nullptr;
  }
  for (const GuidedField& f : kGuidedFields)
    if (const Json* v = field(body, f.field)) {
      grammar = f.make(*v, f.field);
      ++sources;
    }
  if (const Json* so = field(body, "structured_outputs")) {
    if (!so->is_object())
      throw bad_request("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [key, value] : so->items()) {
      if (value.is_null() || is_structured_outputs_option(key, value, s)) continue;
      if (key == "json_object" && value.is_boolean()) {
        if (!value.get<bool>()) continue;
        grammar = runtime::json_object_grammar();
        ++sources;
        continue;
      }
      const auto f = std::find_if(std::begin(kGuidedFields), std::end(kGuidedFields),
                                  [&](const GuidedField& g) { return key == g.structured_key; });
      if (f == std::end(kGuidedFields))
        throw bad_request(
            "structured_outputs",
            fmt::format("structured_outputs.{} is not supported (json, json_object, choice, regex, "
                        "grammar; disable_any_whitespace, disable_fallback, "
                        "disable_additional_properties)",
                        key));
      grammar = f->make(value, "structured_outputs");
      ++sources;
    }
  }
  if (sources > 1)
    throw bad_request("response_format",
                      "give one of response_format, guided_json, guided_choice, guided_regex, "
                      "guided_grammar and structured_outputs");
  s.json_grammar = std::move(grammar);
}

}  // namespace serval::server
