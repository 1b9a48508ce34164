// The counter hash behind dummy weights (--load-format dummy), shared by the host generator
// (kernels/cpu/dummy_init.h, used by model::make_dummy_weights) and the CUDA one
// (kernels/cuda/init/dummy_init.h). The functions are constexpr so that device code calls the
// same definitions (the CUDA kernels are built with --expt-relaxed-constexpr).
#pragma once
#include <cstdint>

namespace serval::kernels {

// SplitMix64's output function: a bijective 64-bit mix.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element `counter` of the random stream `key`: u in [0, 1), a multiple of 2^-24 (exact in
// fp32 on the host and the device).
constexpr float dummy_uniform(uint64_t key, uint64_t counter) {
  return float(splitmix64(key + counter) >> 40) * (1.0f / float(1 << 24));
}

// A byte uniform over [lo, hi] (lo <= hi) from u in [0, 1): the dummy NVFP4 block-scale codes.
constexpr uint8_t dummy_code(float u, uint8_t lo, uint8_t hi) {
  const int span = int(hi) - int(lo);
  const int pick = int(u * float(span + 1));
  return uint8_t(int(lo) + (pick < span ? pick : span));
}

}  // namespace serval::kernels
