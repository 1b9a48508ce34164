// Guided decoding (vLLM's structured outputs) from a completions or chat body: response_format
// json_object / json_schema (OpenAI), vLLM's guided_json, guided_choice, guided_regex,
// guided_grammar, and structured_outputs {json, json_object, choice, regex, grammar} with its
// options disable_any_whitespace, disable_fallback and disable_additional_properties. At most
// one constraint.
#pragma once
#include <memory>

#include "base/error.h"
#include "server/api_error.h"
#include "server/request_parser.h"

namespace serval::server {

// A guided decoding grammar from `make`, its InvalidArgument a 400 naming `param`.
template <class Make>
std::shared_ptr<const runtime::JsonGrammar> grammar_or_400(const char* param, Make make) {
  try {
    return make();
  } catch (const InvalidArgument& e) {
    throw bad_request(param, e.what());
  }
}

// A JSON schema given as an object or its JSON text (vLLM's guided_json takes both); 400 naming
// `param` when it does not compile.
std::shared_ptr<const runtime::JsonGrammar> compile_schema(const Json& schema, const char* param);

// Sets s.json_grammar (null: free text) and its options; throws ApiError 400 naming the field
// for what is malformed or not supported.
void parse_guided_decoding(const Json& body, runtime::SamplingParams& s);

}  // namespace serval::server
