// NVFP4 expert stacks for the MoE GPU tests: random E2M1 codes, realistic e4m3 block scales,
// per-expert global scales that differ.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "kernels/moe_test_util.h"

namespace serval::testing::moe_util {

// One quantized stack in checkpoint layout on the host: codes [E, rows, k/2], scales e4m3
// [E, rows, k/16], one global scale per expert.
struct HostStack {
  int experts = 0, rows = 0, k = 0;
  std::vector<uint8_t> codes, scales;
  std::vector<float> global;

  HostStack(int e, int r, int kk, float weight_rms, uint64_t seed) : experts(e), rows(r), k(kk) {
    Rng rng(seed);
    codes.resize(size_t(e) * r * (kk / 2));
    for (size_t i = 0; i < codes.size(); i += 4) {
      const uint32_t v = rng.next();
      for (size_t j = 0; j < 4 && i + j < codes.size(); ++j) codes[i + j] = uint8_t(v >> (8 * j));
    }
    // Realistic block scales: mostly large (0x50..0x7E: 8 … 448, as amax-scaled blocks are),
    // one in 16 small, subnormal or zero (0x00..0x4F). Never 0x7F (NaN).
    scales.resize(size_t(e) * r * (kk / 16));
    for (auto& s : scales) {
      const uint32_t v = rng.next();
      s = (v & 15) == 0 ? uint8_t((v >> 8) % 0x50) : uint8_t(0x50 + (v >> 8) % 0x2F);
    }
    // Random codes have rms ≈ 2.93 and these scales ≈ 150: global scales give the weights about
    // weight_rms, varied ×[0.5, 2) per expert.
    for (int i = 0; i < e; ++i)
      global.push_back(weight_rms / (2.93f * 150.0f) * (1.25f + 0.75f * rng.uniform()));
  }

  backend::QuantizedWeight host_weight() const {
    backend::QuantizedWeight q;
    q.format = kernels::WeightFormat::kNvfp4;
    q.experts = experts;
    q.n = rows;
    q.k = k;
    q.data = host_view(codes.data(), DType::kU8, {experts, rows, k / 2}, nullptr);
    q.scales = host_view(scales.data(), DType::kF8E4M3, {experts, rows, k / 16}, nullptr);
    q.global_scale = global;
    q.input_scale.assign(size_t(experts), 1.0f);
    return q;
  }
};

}  // namespace serval::testing::moe_util
