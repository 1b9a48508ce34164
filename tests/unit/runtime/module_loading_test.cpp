// CUDA module loading for multi-GPU processes (backend::prefer_eager_cuda_module_loading): the
// loader asks for eager loading exactly when several ranks of this process meet in collectives,
// and an explicit CUDA_MODULE_LOADING from the user is kept. CPU runs: only the environment is
// observed, which CUDA reads when it starts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "backend/communicator.h"
#include "runtime/engine_loader.h"

namespace serval::runtime {
namespace {

constexpr const char* kVar = "CUDA_MODULE_LOADING";

// Restores the variable as it was when the test started.
class ModuleLoading : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv(kVar)) saved_ = v;
    unsetenv(kVar);
  }
  void TearDown() override {
    if (saved_) {
      setenv(kVar, saved_->c_str(), 1);
    } else {
      unsetenv(kVar);
    }
  }
  static std::optional<std::string> current() {
    const char* v = std::getenv(kVar);
    return v ? std::optional<std::string>(v) : std::nullopt;
  }
  static EngineConfig config(int tp, int dp, bool ep) {
    EngineConfig cfg;
    cfg.model_dir = std::string(SERVAL_SOURCE_DIR) + "/tests/fixtures/qwen3_moe";
    cfg.device = "cpu";
    cfg.max_num_seqs = 2;
    cfg.cpu_kv_cache_bytes = 8 << 20;
    cfg.tensor_parallel_size = tp;
    cfg.data_parallel_size = dp;
    cfg.enable_expert_parallel = ep;
    return cfg;
  }

 private:
  std::optional<std::string> saved_;
};

TEST_F(ModuleLoading, PreferEagerSetsEagerUnlessTheUserChose) {
  backend::prefer_eager_cuda_module_loading();
  EXPECT_EQ(current(), "EAGER");
  setenv(kVar, "LAZY", 1);
  backend::prefer_eager_cuda_module_loading();
  EXPECT_EQ(current(), "LAZY");
}

TEST_F(ModuleLoading, OneRankLeavesTheDefault) {
  load_model(config(1, 1, false));
  EXPECT_EQ(current(), std::nullopt);
}

TEST_F(ModuleLoading, TensorParallelRanksLoadEagerly) {
  load_model(config(2, 1, false));
  EXPECT_EQ(current(), "EAGER");
}

TEST_F(ModuleLoading, ExpertParallelReplicasLoadEagerly) {
  load_model(config(1, 2, true));
  EXPECT_EQ(current(), "EAGER");
}

}  // namespace
}  // namespace serval::runtime
