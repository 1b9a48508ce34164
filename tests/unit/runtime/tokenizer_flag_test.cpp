// `--tokenizer` (EngineConfig::tokenizer): the tokenizer and chat template come from another
// folder than the weights; a folder without tokenizer.json stops the start naming the flag.
#include <gtest/gtest.h>
#include <filesystem>
#include <string>

#include "base/error.h"
#include "runtime/engine.h"
#include "support/engine_batch.h"
#include "support/weights_only_folder.h"
#include "tokenizer/tokenizer.h"

namespace serval::runtime {
namespace {

using serval::testing::WeightsOnlyFolder;

TEST(TokenizerFlag, TokenizerFromAnotherFolder) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  const std::string fixture = cfg.model_dir;
  auto reference = Engine::create(cfg);
  ASSERT_NE(reference->tokenizer(), nullptr);
  const std::vector<int32_t> ids = reference->tokenizer()->encode("hello tokenizer", false);
  reference->shutdown();

  WeightsOnlyFolder weights(fixture);
  cfg.model_dir = weights.path();
  auto bare = Engine::create(cfg);
  EXPECT_EQ(bare->tokenizer(), nullptr);
  EXPECT_EQ(bare->chat_template(), nullptr);
  bare->shutdown();

  cfg.tokenizer = fixture;
  auto engine = Engine::create(cfg);
  ASSERT_NE(engine->tokenizer(), nullptr);
  EXPECT_NE(engine->chat_template(), nullptr);
  EXPECT_EQ(engine->tokenizer()->encode("hello tokenizer", false), ids);
  engine->shutdown();
}

TEST(TokenizerFlag, FolderWithoutTokenizerStopsTheStart) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  WeightsOnlyFolder weights(cfg.model_dir);
  cfg.tokenizer = weights.path();
  try {
    auto engine = Engine::create(cfg);
    engine->shutdown();
    ADD_FAILURE() << "started with a --tokenizer folder without tokenizer.json";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer " + weights.path()), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace serval::runtime
