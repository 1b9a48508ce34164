// `serval tokenize` / `serval detokenize`: text <-> token ids with a model's tokenizer.json.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <sstream>

#include "apps/commands.h"
#include "base/error.h"
#include "tokenizer/tokenizer.h"

namespace serval::apps {
namespace {

struct TokenizeOptions {
  std::string model, text;
  bool no_special = false;
  std::vector<std::string> ids;
  bool keep_special = false;
};

// Accepts "1,2,3", "1 2 3", separate arguments and a JSON-like "[1, 2]".
std::vector<int32_t> parse_id_args(const std::vector<std::string>& args) {
  std::vector<int32_t> ids;
  for (const auto& arg : args) {
    std::string cleaned = arg;
    for (char& c : cleaned)
      if (c == ',' || c == '[' || c == ']') c = ' ';
    std::istringstream ss(cleaned);
    for (std::string item; ss >> item;) {
      size_t used = 0;
      long value = 0;
      try {
        value = std::stol(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || value < 0 || value > INT32_MAX)
        throw InvalidArgument(fmt::format("'{}' is not a token id", item));
      ids.push_back(static_cast<int32_t>(value));
    }
  }
  return ids;
}

// Runs `body`, turning serval errors into a message and exit status 1.
template <typename Body>
void run_reporting_errors(Body body) {
  try {
    body();
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    throw CLI::RuntimeError(1);
  }
}

}  // namespace

void register_tokenize_commands(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();

  auto* tok = app.add_subcommand("tokenize", "Print the token ids of TEXT as a JSON list");
  tok->add_option("--model", opts->model, "Model folder with tokenizer.json")->required();
  tok->add_flag("--no-special", opts->no_special, "Do not add BOS/EOS special tokens");
  tok->add_option("text", opts->text, "Text to encode")->required();
  tok->callback([opts] {
    run_reporting_errors([&] {
      const auto t = tokenizer::Tokenizer::load(opts->model);
      const auto ids = t->encode(opts->text, !opts->no_special);
      std::cout << fmt::format("[{}]", fmt::join(ids, ", ")) << "\n";
    });
  });

  auto* detok = app.add_subcommand("detokenize", "Print the text of token IDS");
  detok->add_option("--model", opts->model, "Model folder with tokenizer.json")->required();
  detok->add_flag("--keep-special", opts->keep_special, "Print special tokens too");
  detok->add_option("ids", opts->ids, "Token ids: \"1,2,3\" or separate arguments")
      ->required()
      ->allow_extra_args();
  detok->callback([opts] {
    run_reporting_errors([&] {
      const auto t = tokenizer::Tokenizer::load(opts->model);
      const auto ids = parse_id_args(opts->ids);
      std::cout << t->decode(ids, !opts->keep_special) << "\n";
    });
  });
}

}  // namespace serval::apps
