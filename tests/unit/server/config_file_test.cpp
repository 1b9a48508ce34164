// `serve --config FILE`: a YAML mapping of flags read as vLLM reads it (underscores, booleans,
// lists, nested mappings as JSON), the command line winning over the file, and clear errors.
#include "server/config_file.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "server/serve_args.h"
#include "support/fuzz_budget.h"
#include "unit/io/safetensors_writer.h"

namespace serval::server {
namespace {

using io::testing::TempDir;
using io::testing::write_file;

#if SERVAL_HAVE_YAML

std::string config(const TempDir& dir, const std::string& yaml) {
  write_file(dir / "config.yaml", yaml);
  return (dir / "config.yaml").string();
}

TEST(ConfigFile, FlagsOfEveryValueKind) {
  TempDir dir;
  const std::string path = config(dir,
                                  "# a comment\n"
                                  "port: 8001\n"
                                  "tensor_parallel_size: 2\n"
                                  "enable-prefix-caching: false\n"
                                  "enforce-eager: yes\n"
                                  "served-model-name: [a, 'b c']\n"
                                  "hf-overrides: {rope_scaling: {factor: 2.0}, x: null}\n"
                                  "api-key: \"true\"\n"
                                  "seed:\n");
  const auto no_form = [](const std::string& f) { return f == "--no-enable-prefix-caching"; };
  using Groups = std::vector<std::vector<std::string>>;
  EXPECT_EQ(config_file_flags(path, no_form),
            (Groups{{"--port", "8001"},
                    {"--tensor-parallel-size", "2"},
                    {"--no-enable-prefix-caching"},
                    {"--enforce-eager"},
                    {"--served-model-name", "a", "b c"},
                    {"--hf-overrides", R"({"rope_scaling":{"factor":2.0},"x":null})"},
                    {"--api-key", "true"}}));  // quoted: a string
}

TEST(ConfigFile, ServeArgsTakeTheFileUnderTheCommandLine) {
  TempDir dir;
  const std::string path = config(dir,
                                  "model: /models/from-file\n"
                                  "port: 8001\n"
                                  "max_num_seqs: 64\n"
                                  "enable_prefix_caching: false\n"
                                  "scheduling-policy: priority\n"
                                  "compilation-config: {cudagraph_mode: NONE}\n");
  const ServeArgs only_file = parse_serve_args({"--config", path}, nullptr);
  EXPECT_EQ(only_file.engine.model_dir, "/models/from-file");
  EXPECT_EQ(only_file.server.port, 8001);
  EXPECT_EQ(only_file.engine.max_num_seqs, 64);
  EXPECT_FALSE(only_file.engine.enable_prefix_caching);
  EXPECT_TRUE(only_file.engine.priority_scheduling);
  EXPECT_EQ(only_file.engine.cudagraph_mode, "NONE");

  // The command line wins: its model, its port, its prefix-caching switch.
  const ServeArgs both = parse_serve_args(
      {"/models/cli", "--config=" + path, "--port", "9000", "--enable-prefix-caching"}, nullptr);
  EXPECT_EQ(both.engine.model_dir, "/models/cli");
  EXPECT_EQ(both.server.port, 9000);
  EXPECT_TRUE(both.engine.enable_prefix_caching);
  EXPECT_EQ(both.engine.max_num_seqs, 64);
}

TEST(ConfigFile, ErrorsNameTheFileAndLine) {
  TempDir dir;
  const auto message = [&](const std::string& yaml) {
    try {
      (void)parse_serve_args({"--config", config(dir, yaml)}, nullptr);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("port: [8001\n").find("config.yaml: line"), std::string::npos);
  EXPECT_NE(message("- port\n").find("expected a mapping"), std::string::npos);
  EXPECT_NE(message("prot: 8001\n").find("did you mean '--port'"), std::string::npos);
  EXPECT_NE(message("served-model-name: [[a]]\n").find("line 1"), std::string::npos);
  EXPECT_NE(message("config: other.yaml\n").find("another config file"), std::string::npos);
  EXPECT_THROW(parse_serve_args({"/m", "--config", (dir / "missing.yaml").string()}, nullptr),
               InvalidArgument);
  EXPECT_THROW(parse_serve_args({"/m", "--config"}, nullptr), InvalidArgument);
}

// Damaged and hostile files (stitched YAML pieces, anchors and aliases, deep nesting, random
// bytes) give flags or an InvalidArgument, never another exception or a crash.
TEST(ConfigFile, FuzzedFilesFailCleanly) {
  static const char* kPieces[] = {"port",  ": ",    "8001",   "\n",  "- ",   "[",   "]",
                                  "{",     "}",     ", ",     "&a ", "*a",   "'",   "\"",
                                  "true",  "null",  "~",      "  ",  "#",    "|\n", ">\n",
                                  "---\n", "...\n", "!!str ", "\t",  "\xff", "é",   "?"};
  TempDir dir;
  std::mt19937 rng(serval::testing::fuzz_seed(20261213));
  const auto any_flag = [](const std::string&) { return true; };
  int parsed = 0;
  for (int it = 0; it < serval::testing::fuzz_iterations(3000); ++it) {
    std::string text;
    for (int n = int(rng() % 24); n > 0; --n) {
      if (rng() % 12 == 0)
        text += char(rng() % 256);
      else
        text += kPieces[rng() % (sizeof kPieces / sizeof *kPieces)];
    }
    if (it % 100 == 0) text = "a: &x [" + std::string(200, '[') + "*x";  // deep and recursive
    const std::string path = config(dir, text);
    try {
      (void)config_file_flags(path, any_flag);
      ++parsed;
    } catch (const InvalidArgument&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << it << ": " << e.what() << " for '" << text << "'";
    }
  }
  EXPECT_GT(parsed, 100);  // the generator reaches files that read
}

#else

TEST(ConfigFile, WithoutLibyamlTheFlagSaysSo) {
  EXPECT_THROW(parse_serve_args({"/m", "--config", "c.yaml"}, nullptr), InvalidArgument);
}

#endif

}  // namespace
}  // namespace serval::server
