// Damaged config.json / hf_quant_config.json: random values at random places of the fixtures'
// and the bench configs' real files. Parsing must succeed or throw a serval::Error naming what
// is wrong; a config that parses must give sizes a loader can trust (a positive parameter count
// within the bound parse_model_config promises, non-negative weight bytes).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/json_reader.h"
#include "io/model_config.h"
#include "model/quantized_weight.h"
#include "quant/quant_config.h"
#include "support/fuzz_budget.h"
#include "support/json_mutator.h"

namespace serval::model {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Source {
  json config, hf_quant;  // hf_quant is null where the folder has no hf_quant_config.json
};

std::vector<Source> sources() {
  std::vector<fs::path> dirs;
  for (const char* root :
       {SERVAL_SOURCE_DIR "/tests/fixtures", SERVAL_SHARED_DIR "/bench-configs"}) {
    if (!fs::is_directory(root)) continue;
    for (const auto& entry : fs::directory_iterator(root))
      if (fs::exists(entry.path() / "config.json")) dirs.push_back(entry.path());
  }
  std::vector<Source> out;
  for (const fs::path& d : dirs) {
    Source s{json::parse(io::read_text_file((d / "config.json").string())), nullptr};
    if (fs::exists(d / "hf_quant_config.json"))
      s.hf_quant = json::parse(io::read_text_file((d / "hf_quant_config.json").string()));
    out.push_back(std::move(s));
  }
  return out;
}

TEST(ModelConfigFuzz, DamagedConfigsParseOrGiveAnError) {
  const std::vector<Source> all = sources();
  ASSERT_GE(all.size(), 8u);
  testing::JsonMutator m(
      testing::fuzz_seed(47), {"silu", "gelu", "llama3", "NVFP4", "FP8", "bfloat16", "lm_head"},
      {"hidden_size", "num_hidden_layers", "num_experts", "head_dim", "rope_scaling",
       "quantization_config", "quant_algo", "exclude_modules", "num_key_value_heads"});
  int parsed = 0;
  const int iterations = testing::fuzz_iterations(3000);
  for (int i = 0; i < iterations; ++i) {
    const Source& s = all[m.pick(all.size())];
    json config = s.config, hf_quant = s.hf_quant;
    for (int k = int(m.pick(3)); k >= 0; --k)
      m.mutate(!hf_quant.is_null() && m.pick(3) == 0 ? hf_quant : config);
    const std::string config_text = config.dump();
    const std::string hf_quant_text = hf_quant.is_null() ? "" : hf_quant.dump();
    try {
      const io::ModelConfig mc = io::parse_model_config(config_text, "config.json");
      const quant::QuantConfig q =
          hf_quant.is_null() ? quant::parse_config_json_quantization(config_text, "config.json")
                             : quant::parse_hf_quant_config(hf_quant_text, "hf_quant_config.json");
      ++parsed;
      const int64_t params = mc.num_parameters();
      EXPECT_GE(params, 1) << config_text;
      EXPECT_LE(params, int64_t(1) << 46) << config_text;
      EXPECT_GE(model_weight_bytes(mc, q, DType::kBF16), 0) << config_text;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a serval::Error: " << e.what() << "\nconfig.json: " << config_text
                    << "\nhf_quant_config.json: " << hf_quant_text;
      return;
    }
  }
  EXPECT_GT(parsed, iterations / 10);  // the damage leaves many configs parseable
}

}  // namespace
}  // namespace serval::model
