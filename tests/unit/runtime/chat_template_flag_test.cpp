// The engine's chat template under `--chat-template` (EngineConfig::chat_template): it replaces
// tokenizer_config.json's, and a bad one stops the start with the flag's name in the error.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "runtime/engine.h"
#include "support/engine_batch.h"
#include "tokenizer/chat_template.h"

namespace serval::runtime {
namespace {

const nlohmann::ordered_json kMessages = {{{"role", "user"}, {"content", "hi"}}};

TEST(ChatTemplateFlag, ReplacesTheTokenizersTemplate) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  auto fixture = Engine::create(cfg);
  ASSERT_NE(fixture->chat_template(), nullptr);
  const std::string own = fixture->chat_template()->render(kMessages, true, nullptr, "", "");
  fixture->shutdown();

  cfg.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}";
  auto engine = Engine::create(cfg);
  ASSERT_NE(engine->chat_template(), nullptr);
  const std::string got = engine->chat_template()->render(kMessages, true, nullptr, "", "");
  engine->shutdown();
  EXPECT_EQ(got, "[user]hi");
  EXPECT_NE(got, own);
}

TEST(ChatTemplateFlag, BadTemplatesStopTheStart) {
  for (const std::string bad : {"/nonexistent/chat.jinja", "{% for m in messages %}unclosed"}) {
    EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
    cfg.chat_template = bad;
    try {
      auto engine = Engine::create(cfg);
      engine->shutdown();
      ADD_FAILURE() << "started with --chat-template '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace serval::runtime
