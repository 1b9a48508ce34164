// Chat templates: renders a Hugging Face chat_template (a Jinja subset) the way transformers
// does (trim_blocks, lstrip_blocks, tojson as json.dumps, raise_exception, strftime_now).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja_ast.h"

namespace serval::tokenizer {

class ChatTemplate {
 public:
  // Parses the template; throws LoadError naming the unsupported construct or syntax error
  // and its line.
  explicit ChatTemplate(std::string source);

  // Renders with variables messages, add_generation_prompt, tools (null if none), bos_token,
  // eos_token, plus `extra` keys (which override the former). Throws InvalidArgument on
  // raise_exception (with its message) or render errors (message says what and the line).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools, const std::string& bos_token,
                     const std::string& eos_token,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }

  // Whether the template loops over a message's content (`for part in message['content']`,
  // `… in m.content`): it then expects content as a list of parts, OpenAI's form, rather than a
  // string (vLLM's --chat-template-content-format auto asks the same of the template).
  bool iterates_message_content() const { return iterates_content_; }

 private:
  std::string source_;
  jinja::Body body_;
  bool iterates_content_ = false;
};

// The template source of `serve --chat-template VALUE`, as vLLM reads the flag: the contents of
// the file VALUE names; else, when VALUE holds a '{' or a line break, VALUE itself (a template in
// one argument). Throws InvalidArgument for a VALUE that is neither (a path that does not open)
// and for an empty template.
std::string chat_template_from_arg(const std::string& value);

}  // namespace serval::tokenizer
