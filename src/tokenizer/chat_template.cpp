// Chat templates.
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "base/error.h"
#include "tokenizer/jinja_evaluator.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"

namespace serval::tokenizer {

std::string chat_template_from_arg(const std::string& value) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(value, ec)) {
    std::ifstream in(value, std::ios::binary);
    if (!in) throw InvalidArgument("--chat-template: cannot open the file '" + value + "'");
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().empty())
      throw InvalidArgument("--chat-template: the file '" + value + "' is empty");
    return text.str();
  }
  if (value.find_first_of("{\n") == std::string::npos)
    throw InvalidArgument("--chat-template: '" + value +
                          "' is neither a readable file nor a template (it has no '{')");
  return value;
}

ChatTemplate::ChatTemplate(std::string source) : source_(std::move(source)) {
  body_ = jinja::parse(jinja::tokenize(source_));
  static const std::regex kContentLoop(
      R"(\bfor\s+\w+(\s*,\s*\w+)?\s+in\s+\w+\s*(\.\s*content\b|\[\s*['"]content['"]\s*\]))");
  iterates_content_ = std::regex_search(source_, kContentLoop);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& tools, const std::string& bos_token,
                                 const std::string& eos_token,
                                 const nlohmann::ordered_json& extra) const {
  using jinja::Value;
  jinja::ValueDict vars = jinja::builtin_globals();
  vars.set("messages", Value::from_json(messages));
  vars.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  vars.set("tools", Value::from_json(tools));
  vars.set("bos_token", Value::string(bos_token));
  vars.set("eos_token", Value::string(eos_token));
  if (!extra.is_null()) {
    if (!extra.is_object())
      throw InvalidArgument("chat template extra variables must be an object");
    for (auto it = extra.begin(); it != extra.end(); ++it)
      vars.set(it.key(), Value::from_json(it.value()));
  }
  return jinja::render(body_, vars);
}

}  // namespace serval::tokenizer
