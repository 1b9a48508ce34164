// Shards of the three bench configs for tp in {1,2,4,8}: every split dimension is partitioned
// exactly (no gap, no overlap), replicated KV heads cover every KV head and serve the right
// query heads, and expert slices partition the experts.
#include "dist/layout.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"

namespace serval::dist {
namespace {

struct Shape {
  std::string name;
  int heads, kv_heads, head_dim;
  int64_t intermediate, vocab;
  int experts;  // 0: dense
  int64_t moe_intermediate;
};

// From /work/shared/bench-configs/<name>/config.json (cross-checked by MatchesConfigFiles).
const std::vector<Shape> kShapes = {
    {"qwen3-0.6b", 16, 8, 128, 3072, 151936, 0, 0},
    {"qwen3-30b-a3b", 32, 4, 128, 6144, 151936, 128, 768},
    {"llama-3.3-70b", 64, 8, 128, 28672, 128256, 0, 0},
};
const int kTpSizes[] = {1, 2, 4, 8};

// The ranges, in rank order, tile [0, total) with no gap, no overlap and no empty shard.
void expect_partition(const std::vector<Range>& parts, int64_t total, const std::string& what) {
  int64_t at = 0;
  for (size_t r = 0; r < parts.size(); ++r) {
    EXPECT_EQ(parts[r].begin, at) << what << " rank " << r;
    EXPECT_GT(parts[r].size(), 0) << what << " rank " << r;
    at = parts[r].end;
  }
  EXPECT_EQ(at, total) << what;
}

TEST(Layout, ShapesMatchConfigFiles) {
  for (const Shape& s : kShapes) {
    auto path = std::filesystem::path(SERVAL_SHARED_DIR) / "bench-configs" / s.name / "config.json";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "no bench config at " << path;
    auto c = nlohmann::json::parse(std::ifstream(path));
    EXPECT_EQ(c["num_attention_heads"], s.heads) << s.name;
    EXPECT_EQ(c["num_key_value_heads"], s.kv_heads) << s.name;
    EXPECT_EQ(c["head_dim"], s.head_dim) << s.name;
    EXPECT_EQ(c["intermediate_size"], s.intermediate) << s.name;
    EXPECT_EQ(c["vocab_size"], s.vocab) << s.name;
    EXPECT_EQ(c.value("num_experts", 0), s.experts) << s.name;
    EXPECT_EQ(c.value("moe_intermediate_size", 0), s.moe_intermediate) << s.name;
  }
}

TEST(Layout, AttentionHeadsPartitionAndKvMapping) {
  for (const Shape& s : kShapes) {
    for (int tp : kTpSizes) {
      std::string what = s.name + " tp=" + std::to_string(tp);
      std::vector<Range> q_heads, q_rows, kv_heads, kv_rows;
      std::vector<int> kv_holders(s.kv_heads, 0);
      for (int r = 0; r < tp; ++r) {
        AttentionShard a = shard_attention({r, tp}, s.heads, s.kv_heads, s.head_dim);
        q_heads.push_back(a.q_heads);
        q_rows.push_back(a.q_rows);
        kv_heads.push_back(a.kv_heads);
        kv_rows.push_back(a.kv_rows);
        EXPECT_EQ(a.o_cols, a.q_rows) << what;
        EXPECT_EQ(a.kv_replicated, s.kv_heads < tp) << what;
        EXPECT_EQ(a.kv_rows.size(), a.kv_heads.size() * s.head_dim) << what;
        for (int64_t h = a.kv_heads.begin; h < a.kv_heads.end; ++h) ++kv_holders[h];
        // Oracle (HF repeat_kv): query head h reads KV head h / (heads / kv_heads).
        for (int j = 0; j < a.q_heads.size(); ++j) {
          int64_t global_q = a.q_heads.begin + j;
          int64_t want_kv = global_q / (s.heads / s.kv_heads);
          ASSERT_TRUE(a.kv_heads.contains(want_kv)) << what << " rank " << r << " q " << global_q;
          EXPECT_EQ(a.kv_heads.begin + a.local_kv_head(j), want_kv) << what << " q " << global_q;
        }
      }
      expect_partition(q_heads, s.heads, what + " q heads");
      expect_partition(q_rows, int64_t{s.heads} * s.head_dim, what + " q rows");
      if (s.kv_heads >= tp) {
        expect_partition(kv_heads, s.kv_heads, what + " kv heads");
        expect_partition(kv_rows, int64_t{s.kv_heads} * s.head_dim, what + " kv rows");
      } else {  // replicated: every KV head on exactly tp / kv_heads ranks
        for (int h = 0; h < s.kv_heads; ++h)
          EXPECT_EQ(kv_holders[h], tp / s.kv_heads) << what << " kv head " << h;
      }
    }
  }
}

TEST(Layout, AttentionHandValues) {
  // qwen3-30b-a3b, tp 8: rank 5 holds q heads 20..23 (8 per kv head), i.e. kv head 2 of 4.
  AttentionShard a = shard_attention({5, 8}, 32, 4, 128);
  EXPECT_EQ(a.q_heads, (Range{20, 24}));
  EXPECT_EQ(a.kv_heads, (Range{2, 3}));
  EXPECT_EQ(a.q_rows, (Range{2560, 3072}));
  EXPECT_EQ(a.kv_rows, (Range{256, 384}));
  EXPECT_TRUE(a.kv_replicated);
  // llama-3.3-70b, tp 4: rank 3 holds q heads 48..63 and kv heads 6, 7.
  AttentionShard b = shard_attention({3, 4}, 64, 8, 128);
  EXPECT_EQ(b.q_heads, (Range{48, 64}));
  EXPECT_EQ(b.kv_heads, (Range{6, 8}));
  EXPECT_EQ(b.local_kv_head(7), 0);
  EXPECT_EQ(b.local_kv_head(8), 1);
  EXPECT_FALSE(b.kv_replicated);
}

TEST(Layout, AttentionRejectsUnevenSplits) {
  EXPECT_THROW(shard_attention({0, 3}, 16, 8, 128), InvalidArgument);  // 16 heads / 3
  EXPECT_THROW(shard_attention({0, 4}, 24, 6, 128), InvalidArgument);  // 6 kv heads / 4
  EXPECT_THROW(shard_attention({0, 4}, 12, 3, 128), InvalidArgument);  // 4 ranks, 3 kv heads
  EXPECT_THROW(shard_attention({0, 2}, 16, 3, 128), InvalidArgument);  // 16 % 3 (GQA)
  EXPECT_THROW(shard_attention({2, 2}, 16, 8, 128), InvalidArgument);  // rank out of range
  try {
    shard_attention({0, 3}, 16, 8, 128);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-parallel-size 3 does not divide "
                                         "num_attention_heads 16"),
              std::string::npos)
        << e.what();
  }
}

TEST(Layout, MlpIntermediatePartitions) {
  for (const Shape& s : kShapes) {
    for (int tp : kTpSizes) {
      std::vector<Range> parts;
      for (int r = 0; r < tp; ++r) parts.push_back(shard_intermediate({r, tp}, s.intermediate));
      expect_partition(parts, s.intermediate, s.name + " mlp tp=" + std::to_string(tp));
    }
  }
  EXPECT_EQ(shard_intermediate({3, 8}, 28672), (Range{10752, 14336}));
  EXPECT_THROW(shard_intermediate({0, 3}, 3072 + 1), InvalidArgument);
  // 768 / 8 = 96: fine for NVFP4 (16-element scale blocks), not for 128-wide FP8 blocks.
  EXPECT_EQ(shard_intermediate({1, 8}, 768, 16), (Range{96, 192}));
  EXPECT_THROW(shard_intermediate({1, 8}, 768, 128), InvalidArgument);
  EXPECT_EQ(shard_intermediate({1, 2}, 768, 128), (Range{384, 768}));
}

TEST(Layout, VocabPaddedAndPartitioned) {
  for (const Shape& s : kShapes) {
    for (int tp : kTpSizes) {
      std::string what = s.name + " vocab tp=" + std::to_string(tp);
      std::vector<Range> padded, real;
      int64_t padded_vocab = 0;
      for (int r = 0; r < tp; ++r) {
        VocabShard v = shard_vocab({r, tp}, s.vocab);
        padded_vocab = v.padded_vocab;
        padded.push_back(v.padded);
        EXPECT_EQ(v.padded.size() % 64, 0) << what;
        EXPECT_EQ(v.padded.size(), v.padded_vocab / tp) << what;
        EXPECT_EQ(v.real.begin, v.padded.begin) << what;
        EXPECT_LE(v.real.end, v.padded.end) << what;
        if (v.real.size() > 0) real.push_back(v.real);
      }
      EXPECT_EQ(padded_vocab % (64 * tp), 0) << what;
      EXPECT_GE(padded_vocab, s.vocab) << what;
      EXPECT_LT(padded_vocab, s.vocab + 64 * tp) << what;
      expect_partition(padded, padded_vocab, what + " padded");
      expect_partition(real, s.vocab, what + " real");
    }
  }
  // 151936 = 296.75 x 512: padded to 152064 for tp 8; the last rank has 128 padding rows.
  VocabShard v = shard_vocab({7, 8}, 151936);
  EXPECT_EQ(v.padded_vocab, 152064);
  EXPECT_EQ(v.padded, (Range{133056, 152064}));
  EXPECT_EQ(v.real, (Range{133056, 151936}));
  EXPECT_EQ(shard_vocab({0, 1}, 151936).padded_vocab, 151936);
  EXPECT_EQ(shard_vocab({0, 8}, 128256).padded_vocab, 128512);
  // A tiny vocab leaves the last ranks with padding only.
  VocabShard tiny = shard_vocab({3, 4}, 100);
  EXPECT_EQ(tiny.padded, (Range{192, 256}));
  EXPECT_EQ(tiny.real.size(), 0);
}

TEST(Layout, RankCoordinatesRoundTrip) {
  ParallelConfig p{4, 2, true};
  for (int g = 0; g < p.world_size(); ++g) EXPECT_EQ(global_rank(p, rank_coord(p, g)), g);
  EXPECT_EQ(global_rank(p, {1, 2}), 6);
  EXPECT_THROW(rank_coord(p, 8), InvalidArgument);
  EXPECT_THROW(global_rank(p, {2, 0}), InvalidArgument);
}

TEST(Layout, MoeWithoutExpertParallelSplitsIntermediate) {
  for (int tp : kTpSizes) {
    for (int dp : {1, 2}) {
      ParallelConfig p{tp, dp, false};
      for (int d = 0; d < dp; ++d) {
        std::vector<Range> parts;
        for (int t = 0; t < tp; ++t) {
          MoeShard m = shard_moe(p, {d, t}, 128, 768);
          EXPECT_EQ(m.experts, (Range{0, 128}));
          EXPECT_EQ(m.local_expert(77), 77);
          parts.push_back(m.intermediate);
        }
        expect_partition(parts, 768, "moe intermediate tp=" + std::to_string(tp));
      }
    }
  }
}

TEST(Layout, ExpertParallelPartitionsExpertsOverDpTimesTp) {
  for (int tp : kTpSizes) {
    for (int dp : {1, 2}) {
      ParallelConfig p{tp, dp, true};
      std::string what = "ep tp=" + std::to_string(tp) + " dp=" + std::to_string(dp);
      std::vector<Range> parts;
      std::vector<int> holders(128, 0);
      for (int g = 0; g < p.world_size(); ++g) {
        MoeShard m = shard_moe(p, rank_coord(p, g), 128, 768);
        EXPECT_EQ(m.ep_rank, g) << what;
        EXPECT_EQ(m.ep_size, tp * dp) << what;
        EXPECT_EQ(m.local_num_experts(), 128 / (tp * dp)) << what;
        EXPECT_EQ(m.local_expert_offset(), g * m.local_num_experts()) << what;
        EXPECT_EQ(m.intermediate, (Range{0, 768})) << what;
        for (int e = 0; e < 128; ++e) {
          bool mine = m.local_expert(e) >= 0;
          EXPECT_EQ(mine, expert_owner(p, 128, e) == g) << what << " e " << e;
          if (mine) {
            ++holders[e];
            EXPECT_EQ(m.local_expert(e), e - m.local_expert_offset());
          }
        }
        parts.push_back(m.experts);
      }
      expect_partition(parts, 128, what);
      for (int e = 0; e < 128; ++e) EXPECT_EQ(holders[e], 1) << what << " e " << e;
    }
  }
  // tp 4 x dp 2: global rank 6 = (dp 1, tp 2) holds experts 96..111.
  MoeShard m = shard_moe({4, 2, true}, {1, 2}, 128, 768);
  EXPECT_EQ(m.experts, (Range{96, 112}));
  EXPECT_THROW(shard_moe({3, 1, true}, {0, 0}, 128, 768), InvalidArgument);
  EXPECT_THROW(expert_owner({2, 1, false}, 128, 0), InvalidArgument);
}

}  // namespace
}  // namespace serval::dist
