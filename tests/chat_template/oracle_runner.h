// Test helper: renders chat-template cases with the reference implementations
// (Python Jinja2 via oracle.py, @huggingface/jinja via oracle.mjs) through popen.
#pragma once
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::test {

enum class Oracle { kPythonJinja2, kHfJinjaJs };

struct OracleResult {
  bool ok = false;
  std::string out;    // rendered text when ok
  std::string error;  // exception text when !ok
};

inline std::string oracle_dir() {
  return std::string(SERVAL_SOURCE_DIR) + "/tests/chat_template";
}

// Why the oracle cannot run here, or nullopt when it can.
inline std::optional<std::string> oracle_unavailable(Oracle o) {
  if (o == Oracle::kPythonJinja2) {
    if (std::system("python3 -c 'import jinja2' >/dev/null 2>&1") != 0)
      return "python3 with jinja2 is not installed";
    return std::nullopt;
  }
  const std::string pkg =
      std::string(SERVAL_SOURCE_DIR) + "/tests/npm/node_modules/@huggingface/jinja/dist/index.js";
  if (!std::filesystem::exists(pkg)) return "@huggingface/jinja missing: " + pkg;
  if (std::system("node --version >/dev/null 2>&1") != 0) return "node is not installed";
  return std::nullopt;
}

// `cases`: JSON array of {"template": str, "context": {...}}. Returns one result per case.
inline std::vector<OracleResult> run_oracle(Oracle o, const nlohmann::ordered_json& cases) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("serval_jinja_cases_" + std::to_string(::getpid()) + ".json"))
                               .string();
  {
    std::ofstream f(path, std::ios::binary);
    f << cases.dump();
  }
  const std::string cmd = o == Oracle::kPythonJinja2
                              ? "python3 " + oracle_dir() + "/oracle.py " + path
                              : "node " + oracle_dir() + "/oracle.mjs " + path;
  std::string text;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
    ::pclose(p);
  }
  std::filesystem::remove(path);
  std::vector<OracleResult> results;
  const auto j = nlohmann::json::parse(text);
  for (const auto& r : j) {
    OracleResult res;
    res.ok = r.at("ok").get<bool>();
    if (res.ok)
      res.out = r.at("out").get<std::string>();
    else
      res.error = r.at("error").get<std::string>();
    results.push_back(res);
  }
  return results;
}

}  // namespace serval::test
