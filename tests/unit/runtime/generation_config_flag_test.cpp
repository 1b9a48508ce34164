// `--generation-config` and `--override-generation-config` (EngineConfig): the sampling defaults
// come from the model's generation_config.json (auto), none (vllm) or another folder's, with the
// override's keys set over them; a path that is no folder stops the start naming the flag.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "runtime/engine.h"
#include "support/engine_batch.h"

namespace serval::runtime {
namespace {

// A folder holding one generation_config.json, removed with the object.
class GenerationConfigFolder {
 public:
  explicit GenerationConfigFolder(const std::string& json) {
    path_ =
        std::filesystem::temp_directory_path() /
        ("serval-genconfig-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "-" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::create_directories(path_);
    std::ofstream(path_ / "generation_config.json") << json;
  }
  ~GenerationConfigFolder() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

SamplingParams defaults_of(const EngineConfig& cfg) {
  auto engine = Engine::create(cfg);
  const SamplingParams d = engine->info().default_sampling;
  engine->shutdown();
  return d;
}

TEST(GenerationConfigFlag, FolderVllmAndOverride) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  const SamplingParams plain = defaults_of(cfg);  // the fixture's file sets no sampling keys
  EXPECT_EQ(plain.temperature, SamplingParams{}.temperature);

  GenerationConfigFolder other(R"({"temperature": 0.3, "top_p": 0.8})");
  cfg.generation_config = other.path();
  SamplingParams d = defaults_of(cfg);
  EXPECT_FLOAT_EQ(d.temperature, 0.3f);
  EXPECT_FLOAT_EQ(d.top_p, 0.8f);

  cfg.override_generation_config = R"({"top_p": 0.5, "top_k": 7, "max_new_tokens": 9})";
  auto capped = Engine::create(cfg);
  EXPECT_EQ(capped->info().max_new_tokens, 9);
  capped->shutdown();
  d = defaults_of(cfg);
  EXPECT_FLOAT_EQ(d.temperature, 0.3f);  // the folder's, kept
  EXPECT_FLOAT_EQ(d.top_p, 0.5f);        // the override's
  EXPECT_EQ(d.top_k, 7);

  cfg.generation_config = "vllm";  // no defaults from any file: only the override's
  d = defaults_of(cfg);
  EXPECT_EQ(d.temperature, SamplingParams{}.temperature);
  EXPECT_EQ(d.top_k, 7);

  cfg.generation_config = other.path() + "/missing";
  try {
    Engine::create(cfg);
    ADD_FAILURE() << "started with --generation-config naming no folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--generation-config"), std::string::npos) << e.what();
  }
  cfg.generation_config = "auto";
  cfg.override_generation_config = R"({"temprature": 0.1})";
  try {
    Engine::create(cfg);
    ADD_FAILURE() << "started with a misspelt override key";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'temprature'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace serval::runtime
