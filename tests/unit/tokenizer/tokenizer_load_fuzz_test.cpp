// Damaged tokenizer.json / tokenizer_config.json: random values at random places of the
// fixtures' real files (wrong types, huge or negative numbers, empty containers, removed keys).
// Loading must succeed or throw a serval::Error (LoadError naming what is wrong); a tokenizer
// that loads must encode and decode without any other exception.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "support/fuzz_budget.h"
#include "support/json_mutator.h"
#include "tokenizer/tokenizer.h"

namespace serval::tokenizer {
namespace {

using nlohmann::json;

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(TokenizerLoadFuzz, DamagedFilesLoadOrGiveAnError) {
  struct Source {
    json tok, cfg;
  };
  std::vector<Source> sources;
  for (const char* model : {"qwen3", "llama", "mixtral"}) {
    const std::string dir = std::string(SERVAL_SOURCE_DIR) + "/tests/fixtures/" + model;
    sources.push_back({json::parse(read(dir + "/tokenizer.json")),
                       json::parse(read(dir + "/tokenizer_config.json"))});
  }
  testing::JsonMutator m(testing::fuzz_seed(31), {"Ġ", "a", "<s>", "a b"},
                         {"type", "vocab", "merges", "content", "id"});
  int loaded = 0;
  const int iterations = testing::fuzz_iterations(1500);
  for (int i = 0; i < iterations; ++i) {
    const Source& s = sources[m.pick(sources.size())];
    json tok = s.tok, cfg = s.cfg;
    for (int k = int(m.pick(3)); k >= 0; --k) m.mutate(m.pick(4) == 0 ? cfg : tok);
    const std::string tok_text = tok.dump(), cfg_text = cfg.dump();
    try {
      auto t = Tokenizer::from_json(tok_text, cfg_text);
      ++loaded;
      const std::vector<int32_t> ids = t->encode("Hello world, 123 <s> é", true);
      t->decode(ids, false);
      const std::vector<int32_t> some = {0, 1, 2, 3, 400};
      t->decode(some, true);
    } catch (const Error&) {
      // LoadError at load; InvalidArgument from encode/decode of a broken vocabulary
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a serval::Error: " << e.what()
                    << "\ntokenizer.json: " << tok_text.substr(0, 2000)
                    << "\ntokenizer_config.json: " << cfg_text;
      return;
    }
  }
  EXPECT_GT(loaded, iterations / 20);  // the damage leaves many files loadable
}

}  // namespace
}  // namespace serval::tokenizer
