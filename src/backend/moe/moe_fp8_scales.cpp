#include "backend/moe/moe_fp8_scales.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/fp8_multiplier.h"
#include "kernels/moe_fp8_layout.h"

namespace serval::backend::moe {

namespace {

void check_geometry(const MoeFp8Geometry& g, const char* what) {
  if (g.experts <= 0 || !kernels::moe_fp8_padding_ok(g.src_rows, g.src_k, g.rows, g.k, g.gated))
    throw InvalidArgument(std::string(what) + ": unsupported geometry (" +
                          std::to_string(g.experts) + " experts, source " +
                          std::to_string(g.src_rows) + "×" + std::to_string(g.src_k) + ", padded " +
                          std::to_string(g.rows) + "×" + std::to_string(g.k) + ")");
}

}  // namespace

std::vector<bf16> moe_fp8_block_multipliers(const float* block_scales, int block_n, int block_k,
                                            const MoeFp8Geometry& g) {
  check_geometry(g, "moe_fp8_block_multipliers");
  if (block_n <= 0 || block_k <= 0 || block_n % 16 != 0 || block_k % 16 != 0)
    throw InvalidArgument("FP8 block experts: block " + std::to_string(block_n) + "×" +
                          std::to_string(block_k) +
                          " is not a multiple of 16 in both dimensions (the CUDA MoE GEMMs apply "
                          "one scale per 16 rows × 16 columns)");
  const int block_rows = (g.src_rows + block_n - 1) / block_n;
  const int block_cols = (g.src_k + block_k - 1) / block_k;
  const int groups = g.rows / 16, tiles_k = g.k / 64;
  // Each block's multiplier once (validated), then placed per 16-row group and 16-column step.
  std::vector<bf16> block_mult(size_t(g.experts) * block_rows * block_cols);
  for (size_t i = 0; i < block_mult.size(); ++i)
    block_mult[i] = kernels::fp8_block_multiplier(block_scales[i], i);
  std::vector<bf16> out(kernels::moe_fp8_multiplier_count(g.experts, g.rows, g.k), bf16{0});
  for (int e = 0; e < g.experts; ++e) {
    for (int mt = 0; mt < groups; ++mt) {
      // The block row of the group's real rows; they must agree.
      int brow = -1;
      for (int r = 16 * mt; r < 16 * mt + 16; ++r) {
        const int src = kernels::moe_padded_source_row(r, g.src_rows, g.rows, g.gated);
        if (src < 0) continue;
        if (brow >= 0 && src / block_n != brow)
          throw InvalidArgument(
              "FP8 block experts: padded rows " + std::to_string(16 * mt) + ".." +
              std::to_string(16 * mt + 15) + " span two " + std::to_string(block_n) +
              "-row scale blocks (the gate/up halves of " + std::to_string(g.src_rows / 2) +
              " rows need a multiple of 16 under the CUDA MoE GEMMs)");
        brow = src / block_n;
      }
      if (brow < 0) continue;  // padding rows: multiplier 0
      for (int kb = 0; kb < tiles_k; ++kb)
        for (int step = 0; step < kernels::kMoeFp8MultipliersPerTile; ++step) {
          const int col = 64 * kb + 16 * step;
          if (col >= g.src_k) continue;
          const size_t src = (size_t(e) * block_rows + brow) * block_cols + col / block_k;
          out[((size_t(e) * groups + mt) * tiles_k + kb) * kernels::kMoeFp8MultipliersPerTile +
              step] = block_mult[src];
        }
    }
  }
  return out;
}

std::vector<float> moe_fp8_row_scales(const float* channel_scales,
                                      std::span<const float> expert_scales,
                                      const MoeFp8Geometry& g) {
  check_geometry(g, "moe_fp8_row_scales");
  if (!channel_scales && expert_scales.size() != size_t(g.experts))
    throw InvalidArgument("FP8 per-tensor experts: " + std::to_string(expert_scales.size()) +
                          " weight scales for " + std::to_string(g.experts) + " experts");
  std::vector<float> out(size_t(g.experts) * g.rows, 0.0f);
  for (int e = 0; e < g.experts; ++e)
    for (int r = 0; r < g.rows; ++r) {
      const int src = kernels::moe_padded_source_row(r, g.src_rows, g.rows, g.gated);
      if (src < 0) continue;
      const float s =
          channel_scales ? channel_scales[size_t(e) * g.src_rows + src] : expert_scales[size_t(e)];
      if (!std::isfinite(s))
        throw InvalidArgument("FP8 experts: the weight scale of expert " + std::to_string(e) +
                              (channel_scales ? ", row " + std::to_string(src) : std::string()) +
                              " is " + std::to_string(s));
      out[size_t(e) * g.rows + r] = s;
    }
  return out;
}

}  // namespace serval::backend::moe
