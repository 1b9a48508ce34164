// Module-name matching: fnmatch globs, re.match regexes, exclude and target lists.
#include <gtest/gtest.h>

#include "base/error.h"
#include "quant/quant_config.h"

namespace serval::quant {
namespace {

TEST(GlobMatch, FnmatchSemantics) {
  EXPECT_TRUE(glob_match("lm_head", "lm_head"));
  EXPECT_FALSE(glob_match("lm_head", "lm_head2"));
  EXPECT_FALSE(glob_match("lm_head", "model.lm_head"));  // whole-name match
  EXPECT_TRUE(glob_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate"));
  EXPECT_FALSE(glob_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate_proj"));
  EXPECT_FALSE(glob_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gat"));
  // '*' crosses dots, as in Python fnmatch.
  EXPECT_TRUE(glob_match("*.mlp.gate", "model.layers.1.mlp.gate"));
  EXPECT_TRUE(glob_match("*self_attn*", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("", ""));
  EXPECT_FALSE(glob_match("", "a"));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(glob_match("model.layers.?.mlp", "model.layers.7.mlp"));
  EXPECT_FALSE(glob_match("model.layers.?.mlp", "model.layers.17.mlp"));
  EXPECT_TRUE(glob_match("layers.[0-2].x", "layers.1.x"));
  EXPECT_FALSE(glob_match("layers.[0-2].x", "layers.3.x"));
  EXPECT_TRUE(glob_match("layers.[!0-2].x", "layers.3.x"));
  EXPECT_FALSE(glob_match("layers.[!0-2].x", "layers.0.x"));
  EXPECT_TRUE(glob_match("a[]]b", "a]b"));  // ']' first in a set is literal
  EXPECT_TRUE(glob_match("a[b", "a[b"));    // unterminated set: literal '['
  EXPECT_FALSE(glob_match("a[b", "ab"));
  EXPECT_TRUE(glob_match("model.layers.1*.mlp", "model.layers.15.mlp"));
}

TEST(RegexMatchPrefix, BehavesLikePythonReMatch) {
  EXPECT_TRUE(regex_match_prefix(".*mlp\\.gate$", "model.layers.0.mlp.gate"));
  EXPECT_FALSE(regex_match_prefix(".*mlp\\.gate$", "model.layers.0.mlp.gate_proj"));
  // re.match anchors at the start but not at the end.
  EXPECT_TRUE(regex_match_prefix("model\\.layers\\.0\\.", "model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(regex_match_prefix("layers\\.0", "model.layers.0.mlp"));
  EXPECT_TRUE(
      regex_match_prefix("model.layers.[0-3].self_attn", "model.layers.2.self_attn.q_proj"));
  EXPECT_THROW(regex_match_prefix("(unclosed", "x"), InvalidArgument);
}

TEST(IsQuantized, ExcludeAndTargetLists) {
  QuantConfig c;
  EXPECT_FALSE(is_quantized(c, "model.layers.0.self_attn.q_proj"));  // kNone
  c.method = QuantConfig::Method::kFp8PerTensor;
  EXPECT_TRUE(is_quantized(c, "model.layers.0.self_attn.q_proj"));
  c.exclude_names = {"model.layers.0.self_attn.q_proj"};
  c.exclude_globs = {"*.mlp.gate"};
  c.exclude_regexes = {"model\\.layers\\.1\\."};
  EXPECT_FALSE(is_quantized(c, "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(is_quantized(c, "model.layers.0.self_attn.k_proj"));
  EXPECT_FALSE(is_quantized(c, "model.layers.5.mlp.gate"));
  EXPECT_FALSE(is_quantized(c, "model.layers.1.mlp.down_proj"));
  EXPECT_TRUE(is_quantized(c, "model.layers.10.mlp.down_proj"));
  c.target_regexes = {".*experts"};
  EXPECT_TRUE(is_quantized(c, "model.layers.10.mlp.experts.1.down_proj"));
  EXPECT_FALSE(is_quantized(c, "model.layers.10.mlp.down_proj"));
}

TEST(ShardsQuantized, AgreeOrFail) {
  QuantConfig c;
  c.method = QuantConfig::Method::kNvfp4;
  c.source = "/m/hf_quant_config.json";
  c.exclude_globs = {"model.layers.0.self_attn.k_proj"};
  EXPECT_TRUE(
      shards_quantized(c, {"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
                           "model.layers.1.self_attn.v_proj"}));
  try {
    shards_quantized(c, {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                         "model.layers.0.self_attn.v_proj"});
    ADD_FAILURE() << "mixed shards accepted";
  } catch (const LoadError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.0.self_attn.k_proj"), std::string::npos) << msg;
    EXPECT_NE(msg.find("/m/hf_quant_config.json"), std::string::npos) << msg;
  }
  c.exclude_globs = {"model.layers.0.self_attn.*"};
  EXPECT_FALSE(
      shards_quantized(c, {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"}));
  EXPECT_THROW(shards_quantized(c, {}), InvalidArgument);
}

}  // namespace
}  // namespace serval::quant
