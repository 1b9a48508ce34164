// How quant_gemv (quant_gemv.cu) spreads a weight over the SMs: the host-side cost model that
// picks the K splits per 32-row tile and the warps per CTA. Plain C++ (no CUDA), so the CPU unit
// test (tests/unit/kernels/quant_gemv_split_test.cpp) checks the choices for real model shapes.
//
// Work item = (tile, split): one warp streams the k blocks [s·KB/S, (s+1)·KB/S) of one 32-row
// tile. Item i = blockIdx.x·W + warp is tile i / S, split i % S, so a tile's S splits may lie in
// different CTAs. With all CTAs resident at once (one wave; required for S > 1) and the hardware
// handing CTAs to SMs in turn, the busiest SM holds ceil(C / sms) CTAs of W warps. Cost of a
// choice, in units of one warp issuing one k block (fitted to two H200 NVFP4 measurements:
// Llama-70B qkv at S = 4, 12 / 8 warps per SM, 25.7 µs; o at S = 8, 16 warps per SM, 14.6 µs; the
// model gives the ratio 1.70 for the measured 1.75):
//   issue of the busiest SM   warps_sm · (kb + kWarpOverheadKb) + ctas_sm · kCtaOverheadKb
//   latency of one warp chain kLatencyWarps · waves · (kb + kWarpOverheadKb)
//   cross-CTA merge           kCrossCtaMergeCost when a tile's splits are not all in one CTA
//                             (fence, arrival atomic and partial loads through L2: ≈ 2 µs, and
//                             the kernel after it starts later. 80 fitted Qwen3-30B o, 64
//                             tiles: 6.5 µs cross-CTA on 128 CTAs vs 5.6 µs in 64 CTAs; 130 fits
//                             Llama-70B q/k/v, 320 tiles, at 28 warps per SM: in-CTA S = 8, W = 8
//                             ran 15.9 µs and the attention after it 10.3 µs, vs 16.0 and 11.5
//                             for the cross-CTA S = 11, W = 9 that 80 chose; b1 TPOT 12.12 vs
//                             12.21 ms, bench/RESULTS.md 2026-12-02)
//   idle SMs                  kIdleSmCost × the fraction of SMs without a CTA (small grids:
//                             Qwen3-30B qkv, 160 tiles, ran 6.1 µs in 80 CTAs of 16 warps vs
//                             5.6 µs in 160 CTAs of 8, which the issue terms tie: 0.5 µs ≈ 20
//                             units at 40 % idle, hence 50)
// Both the merge and the idle cost were first set to the least value that flipped the measured
// choice (80, 10); they now match the measured sizes of the effects.
// with kb = ceil(KB / S). The issue term makes the per-SM bytes even (the busiest SM sets the
// time), the latency term favours short per-warp chains (more warps per SM), the merge term keeps
// the shared-memory reduction when it costs nearly as little (W a multiple of S).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace serval::kernels::cuda {

inline constexpr int kGemvMaxSplits = 16;    // S ≤ 16: the last warp merges ≤ 16 partials
inline constexpr int kGemvMinSplitKb = 4;    // k blocks per warp when S > 1 (at least; FP8
                                             // Qwen3-30B qkv ran 7.2 µs at ~3, 6.0 µs at 4)
inline constexpr int kGemvMaxCtaWarps = 16;  // the kernel's __launch_bounds__ (512 threads)
// Work items with a partial-sum slot in the device workspace of the cross-CTA merge (1 KB each):
// the resident capacity of an H200 is 132 SMs × 20..28 warps (72–96 registers) ≈ 2640 .. 3696.
inline constexpr int kGemvMaxSplitItems = 4096;
inline constexpr int kGemvMaxSplitTiles = kGemvMaxSplitItems / 2;  // arrival counters (S ≥ 2)

inline constexpr double kGemvWarpOverheadKb = 1.0;  // prologue, ring fill, epilogue stores
inline constexpr double kGemvCtaOverheadKb = 0.5;   // NVFP4 scale table, CTA launch
inline constexpr double kGemvLatencyWarps = 16.0;
inline constexpr double kGemvCrossCtaMergeCost = 130.0;
inline constexpr double kGemvIdleSmCost = 50.0;  // times the fraction of SMs given no CTA

struct GemvSplit {
  int splits = 1;      // S: K splits per tile
  int cta_warps = 1;   // W: warps per CTA
  int ctas = 0;        // grid: ceil(n_tiles · S / W)
  bool in_cta = true;  // every tile's splits in one CTA (W % S == 0): shared-memory merge
  double cost = 0.0;   // the model's cost (see the top of this file)
};

namespace gemv_split_detail {
inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
}  // namespace gemv_split_detail

// The choice (S, W) for n_tiles tiles with its derived fields (in_cta, ctas) and `cost`.
inline GemvSplit make_gemv_split(int n_tiles, int S, int W, double cost = 0.0) {
  GemvSplit c;
  c.splits = S;
  c.cta_warps = W;
  c.in_cta = W % S == 0;
  c.ctas = int(gemv_split_detail::ceil_div(int64_t(n_tiles) * S, W));
  c.cost = cost;
  return c;
}

// Cost of (S, W) for n_tiles tiles of k_blocks k blocks on sm_count SMs that each hold
// warps_per_sm resident warps (register-limited: floor(warps_per_sm / W) CTAs of W warps, at most
// 32). Returns a negative cost when the choice is not allowed: S > 1 needs ≥ kGemvMinSplitKb k
// blocks per warp and a resident grid, a cross-CTA merge at most max_items work items.
inline double gemv_split_cost(int n_tiles, int k_blocks, int sm_count, int warps_per_sm, int S,
                              int W, int max_items = kGemvMaxSplitItems) {
  using gemv_split_detail::ceil_div;
  if (S < 1 || W < 1 || W > kGemvMaxCtaWarps || W > warps_per_sm) return -1.0;
  if (S > 1 && (S > kGemvMaxSplits || k_blocks < kGemvMinSplitKb * S)) return -1.0;
  const bool in_cta = W % S == 0;
  const int64_t items = int64_t(n_tiles) * S;
  const int64_t ctas = ceil_div(items, W);
  const int64_t slots = std::min(warps_per_sm / W, 32);  // resident CTAs per SM
  if (S > 1 && ctas > slots * sm_count) return -1.0;
  if (S > 1 && !in_cta && items > max_items) return -1.0;
  const int64_t ctas_sm = ceil_div(ctas, sm_count);
  const int64_t warps_sm = std::min<int64_t>(ctas_sm * W, items);
  const int64_t waves = ceil_div(ctas_sm, slots);
  const double kb = double(ceil_div(k_blocks, S)) + kGemvWarpOverheadKb;
  double cost = double(warps_sm) * kb + double(ctas_sm) * kGemvCtaOverheadKb +
                kGemvLatencyWarps * double(waves) * kb;
  if (S > 1 && !in_cta) cost += kGemvCrossCtaMergeCost;
  if (ctas < sm_count) cost += kGemvIdleSmCost * double(sm_count - ctas) / double(sm_count);
  return cost;
}

// The cheapest (S, W) by gemv_split_cost (ties: fewer splits, then fewer warps per CTA). S = 1 is
// always allowed (any grid, several waves), so there is always a choice.
inline GemvSplit choose_gemv_split(int n_tiles, int k_blocks, int sm_count, int warps_per_sm,
                                   int max_items = kGemvMaxSplitItems) {
  sm_count = std::max(sm_count, 1);
  warps_per_sm = std::max(warps_per_sm, 1);
  int best_s = 1, best_w = 1;
  double best = -1.0;
  for (int S = 1; S <= kGemvMaxSplits; ++S) {
    for (int W = 1; W <= std::min(kGemvMaxCtaWarps, warps_per_sm); ++W) {
      const double c = gemv_split_cost(n_tiles, k_blocks, sm_count, warps_per_sm, S, W, max_items);
      if (c < 0.0 || (best >= 0.0 && c >= best)) continue;
      best_s = S;
      best_w = W;
      best = c;
    }
  }
  return make_gemv_split(n_tiles, best_s, best_w, best);
}

// Weight k blocks per SM when CTA c runs on SM c % sm_count (how the grid's CTAs are handed out
// when they all fit at once; for S = 1 grids of several waves an estimate): the busiest SM's,
// the mean, and the most warps one SM runs over the whole kernel.
struct GemvSmLoad {
  int64_t max_kb = 0;
  double mean_kb = 0.0;
  int max_warps = 0;
};

inline GemvSmLoad gemv_sm_load(const GemvSplit& c, int n_tiles, int k_blocks, int sm_count) {
  std::vector<int64_t> kb(size_t(std::max(sm_count, 1)), 0);
  std::vector<int> warps(kb.size(), 0);
  const int64_t items = int64_t(n_tiles) * c.splits;
  for (int64_t i = 0; i < items; ++i) {
    const int64_t s = i % c.splits;
    const size_t sm = size_t((i / c.cta_warps) % int64_t(kb.size()));
    kb[sm] += (s + 1) * k_blocks / c.splits - s * k_blocks / c.splits;
    ++warps[sm];
  }
  GemvSmLoad load;
  load.max_kb = *std::max_element(kb.begin(), kb.end());
  load.mean_kb = double(n_tiles) * k_blocks / double(kb.size());
  load.max_warps = *std::max_element(warps.begin(), warps.end());
  return load;
}

// A forced choice for one shape (SERVAL_GEMV_SPLIT, for side-by-side sweeps of the model's
// alternatives): "TILESxKBLOCKS=S,W" entries separated by ';', e.g. "320x128=9,9;256x128=12,12"
// (Llama-70B q/k/v and o). Each is used only where gemv_split_cost allows it.
struct GemvSplitOverride {
  int n_tiles, k_blocks, splits, cta_warps;
};

// Parses the list (empty: none). Throws std::invalid_argument naming the entry that is not
// "TILESxKBLOCKS=S,W" with positive integers.
inline std::vector<GemvSplitOverride> parse_gemv_split_overrides(const std::string& text) {
  std::vector<GemvSplitOverride> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = std::min(text.find(';', pos), text.size());
    const std::string entry = text.substr(pos, end - pos);
    pos = end + 1;
    if (entry.empty()) continue;
    GemvSplitOverride o{};
    char x = 0, eq = 0, comma = 0;
    int used = 0;
    const int n = std::sscanf(entry.c_str(), "%d%c%d%c%d%c%d%n", &o.n_tiles, &x, &o.k_blocks, &eq,
                              &o.splits, &comma, &o.cta_warps, &used);
    if (n != 7 || x != 'x' || eq != '=' || comma != ',' || size_t(used) != entry.size() ||
        o.n_tiles <= 0 || o.k_blocks <= 0 || o.splits <= 0 || o.cta_warps <= 0)
      throw std::invalid_argument("SERVAL_GEMV_SPLIT: entry '" + entry +
                                  "' is not TILESxKBLOCKS=S,W with positive integers");
    out.push_back(o);
  }
  return out;
}

}  // namespace serval::kernels::cuda
