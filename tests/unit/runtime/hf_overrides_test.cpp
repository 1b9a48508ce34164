// --hf-overrides reaches the model config the engine loads; a sliding window (here set through
// it) bounds max_model_len, since serval's full attention equals the window's only within it.
#include <gtest/gtest.h>

#include "base/error.h"
#include "runtime/engine.h"
#include "support/engine_batch.h"

namespace serval::runtime {
namespace {

TEST(HfOverrides, ASlidingWindowBoundsMaxModelLen) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  cfg.max_model_len = 0;  // from the config: max_position_embeddings
  cfg.hf_overrides = R"({"max_position_embeddings": 96})";
  EXPECT_EQ(Engine::create(cfg)->info().max_model_len, 96);

  cfg.hf_overrides = R"({"sliding_window": 40, "use_sliding_window": true})";
  EXPECT_EQ(Engine::create(cfg)->info().max_model_len, 40);  // lowered to the window

  cfg.max_model_len = 64;  // asked for more than the window: refused, naming both
  try {
    (void)Engine::create(cfg);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sliding window (40 tokens)"), std::string::npos)
        << e.what();
  }
  cfg.max_model_len = 40;
  EXPECT_EQ(Engine::create(cfg)->info().max_model_len, 40);
}

}  // namespace
}  // namespace serval::runtime
