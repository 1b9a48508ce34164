// The CUDA MoE workspace layout (host arithmetic only, no GPU needed): for every token count up to
// the one it was sized for, each piece of moe_workspace_view lies inside the workspace, holds what
// its consumers index (moe_routing.h / moe_gemm.h contracts), is 256-byte aligned, and overlaps
// no other piece.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/moe/moe_cuda.h"
#include "base/error.h"
#include "kernels/cuda/moe/moe_routing.h"

namespace serval::backend::moe {
namespace {

struct Piece {
  std::string name;
  uintptr_t begin, bytes;
};

void check_layout(int max_tokens, int tokens, int num_local, MoeCudaBackend backend) {
  SCOPED_TRACE(::testing::Message()
               << "sized for " << max_tokens << " tokens, called with " << tokens << ", num_local "
               << num_local << ", backend " << int(backend));
  constexpr int kTopK = 8, kHidden = 2048, kInter = 768;
  const size_t bytes = moe_workspace_bytes(max_tokens, kTopK, num_local, kHidden, kInter);
  MoeCudaArgs a;
  a.num_tokens = tokens;
  a.num_experts = 128;
  a.top_k = kTopK;
  a.hidden = kHidden;
  a.inter = kInter;
  a.num_local = num_local;
  a.backend = backend;
  // Never dereferenced: the view is pointer arithmetic on the base.
  const uintptr_t base = uintptr_t(1) << 40;
  a.workspace = reinterpret_cast<void*>(base);
  a.workspace_bytes = bytes;
  const MoeWorkspaceView v = moe_workspace_view(a);

  const uintptr_t pairs = uintptr_t(tokens) * kTopK, rows = uintptr_t(v.max_rows);
  ASSERT_EQ(v.max_tiles, kernels::cuda::moe_max_tiles(int(pairs), num_local, v.tile));
  ASSERT_EQ(rows, uintptr_t(v.max_tiles) * v.tile);
  std::vector<Piece> pieces = {
      {"topk_ids", uintptr_t(v.topk_ids), pairs * 4},
      {"topk_weights", uintptr_t(v.topk_weights), pairs * 4},
      {"expanded_to_permuted", uintptr_t(v.expanded_to_permuted), pairs * 4},
      {"permuted_to_token", uintptr_t(v.permuted_to_token), rows * 4},
      {"tile_expert", uintptr_t(v.tile_expert), uintptr_t(v.max_tiles) * 4},
      {"num_tiles", uintptr_t(v.num_tiles), 4},
      {"chunk_counts", uintptr_t(v.chunk_counts),
       uintptr_t(kernels::cuda::kMoeMaxMapChunks) * num_local * 4},
      {"act", uintptr_t(v.act), rows * kInter * 2},
      {"y", uintptr_t(v.y), rows * kHidden * 2},
  };
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& x, const Piece& y) { return x.begin < y.begin; });
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    EXPECT_EQ(p.begin % 256, 0u) << p.name;
    EXPECT_GE(p.begin, base) << p.name;
    EXPECT_LE(p.begin + p.bytes, base + bytes) << p.name << " ends past the workspace";
    if (i + 1 < pieces.size()) {
      EXPECT_LE(p.begin + p.bytes, pieces[i + 1].begin)
          << p.name << " overlaps " << pieces[i + 1].name;
    }
  }
}

TEST(MoeWorkspace, PiecesFitAndAreDisjoint) {
  for (MoeCudaBackend backend : {MoeCudaBackend::kLatency, MoeCudaBackend::kThroughput})
    for (int num_local : {128, 32, 1})
      for (int tokens : {1, 9, 100, 511, 512, 8192}) check_layout(8192, tokens, num_local, backend);
  check_layout(1, 1, 128, MoeCudaBackend::kLatency);
}

// A throughput step of 64 tokens needs one more 128-row tile than any layout for 63 tokens.
TEST(MoeWorkspace, TooSmallIsRejected) {
  MoeCudaArgs a;
  a.backend = MoeCudaBackend::kThroughput;
  a.num_tokens = 64;
  a.num_experts = 128;
  a.top_k = 8;
  a.hidden = 2048;
  a.inter = 768;
  a.num_local = 128;
  a.workspace = reinterpret_cast<void*>(uintptr_t(1) << 40);
  a.workspace_bytes = moe_workspace_bytes(63, 8, 128, 2048, 768);
  EXPECT_THROW(moe_workspace_view(a), InvalidArgument);
}

}  // namespace
}  // namespace serval::backend::moe
