// Which cuBLASLt GEMMs CublasLtGemm times at first use, and how it picks among the candidates.
// Plain C++ (no CUDA), so the CPU unit tests check the rules.
//
// cuBLASLt's heuristic ranks algorithms without running them; for the large GEMMs of prefill the
// first choice is not always the fastest on a given GPU. Those shapes are timed once: the first
// kGemmTuneCandidates heuristic results, kGemmTuneWarmups + kGemmTuneRuns launches each on the
// real operands, the fastest median kept. Tuning is per (m bucket, n, k): the token count m of a
// prefill step varies, so one tuning serves every m up to the next power of two (the algorithm is
// checked against each m's layouts before it is used).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace serval::backend::cuda {

inline constexpr int kGemmTuneCandidates = 4;
inline constexpr int kGemmTuneWarmups = 1;
inline constexpr int kGemmTuneRuns = 3;
// 2·m·n·k below this is not timed: decode-sized GEMMs (and their graphs) keep the heuristic's
// choice, and timing costs more than it saves on small ones. 2^34 ≈ 17 GFLOP ≈ 25 µs on an H200.
inline constexpr double kGemmTuneMinFlops = double(uint64_t(1) << 34);

// The m bucket a tuning serves: the smallest power of two ≥ m (m ≥ 1).
inline int gemm_tune_bucket(int m) {
  int b = 1;
  while (b < m && b < (1 << 30)) b <<= 1;
  return b;
}

inline bool gemm_worth_tuning(int m, int n, int k) {
  return m > 0 && n > 0 && k > 0 && 2.0 * double(m) * double(n) * double(k) >= kGemmTuneMinFlops;
}

// The median of one candidate's timed runs (milliseconds).
inline float gemm_tune_median(std::vector<float> ms) {
  if (ms.empty()) return 0.0f;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Index of the fastest candidate by median time; ties keep the heuristic's order (lower index).
// Candidates that failed to run have a negative time and are never picked; -1 when all failed.
inline int gemm_fastest(const std::vector<float>& median_ms) {
  int best = -1;
  for (int i = 0; i < int(median_ms.size()); ++i)
    if (median_ms[size_t(i)] >= 0.0f &&
        (best < 0 || median_ms[size_t(i)] < median_ms[size_t(best)]))
      best = i;
  return best;
}

// Whether CublasLtGemm::run may load kernels (cuBLASLt loads its kernels lazily): when the shape
// has no plan yet (planning, timing, the first launch) or has one still to be timed (planned during
// a graph capture, where nothing is timed). An eager run of such a shape goes inside the thread's
// first-use fence (base/first_use_fence.h); every other run is a plain launch.
inline bool gemm_run_may_load(bool planned, bool still_to_time) {
  return !planned || still_to_time;
}

}  // namespace serval::backend::cuda
