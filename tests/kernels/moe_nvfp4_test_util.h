// NVFP4 expert stacks for the MoE GPU tests: random E2M1 codes, realistic e4m3 block scales,
// per-expert global scales that differ; their repacked device copies and a test layer of both.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/moe/moe_cuda.h"
#include "kernels/cuda/moe/moe_nvfp4_repack.h"
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

// A stack repacked on the device by the production kernel (no padding: shapes are aligned).
struct DeviceStack {
  std::unique_ptr<DeviceBuffer> codes, scales, global;

  DeviceStack(const HostStack& h, bool gated) {
    DeviceBuffer src_codes(h.codes), src_scales(h.scales);
    codes =
        std::make_unique<DeviceBuffer>(kernels::cuda::moe_nvfp4_data_bytes(h.experts, h.rows, h.k));
    scales = std::make_unique<DeviceBuffer>(
        kernels::cuda::moe_nvfp4_scale_bytes(h.experts, h.rows, h.k));
    global = std::make_unique<DeviceBuffer>(h.global);
    codes->poison();
    scales->poison();
    kernels::cuda::MoeNvfp4RepackParams p{};
    p.src_data = src_codes.as<uint8_t>();
    p.src_scales = src_scales.as<uint8_t>();
    p.dst_data = codes->as<uint8_t>();
    p.dst_scales = scales->as<uint8_t>();
    p.experts = h.experts;
    p.src_rows = p.rows = h.rows;
    p.src_k = p.k = h.k;
    p.gated = gated;
    kernels::cuda::moe_nvfp4_repack(p, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "moe_nvfp4_repack");
  }

  backend::moe::MoeNvfp4Stack view() const {
    return {codes->as<uint8_t>(), scales->as<uint8_t>(), global->as<float>()};
  }
};

// One layer with NVFP4 experts: host stacks for the CPU reference, repacked device copies.
struct Nvfp4Layer : MoeTestLayer {
  HostStack gate_up, down;
  DeviceStack d_gate_up, d_down;

  Nvfp4Layer(MoeShape shape, int offset, int local, uint64_t seed)
      : MoeTestLayer(shape, offset, local),
        gate_up(local, 2 * shape.inter, shape.hidden, 1.0f / std::sqrt(float(shape.hidden)),
                seed + 1),
        down(local, shape.hidden, shape.inter, 1.0f / std::sqrt(float(shape.inter)), seed + 2),
        d_gate_up(gate_up, true),
        d_down(down, false) {
    Rng rng(seed);
    router = random_router(shape, rng);
  }

  void set_cpu_experts(backend::MoeWeights& w) const override {
    w.gate_up_q = gate_up.host_weight();
    w.down_q = down.host_weight();
  }
  void set_cuda_experts(backend::moe::MoeCudaArgs& a) const override {
    a.format = backend::moe::MoeExpertFormat::kNvfp4;
    a.gate_up_q = d_gate_up.view();
    a.down_q = d_down.view();
  }
};

}  // namespace serval::testing::moe_util
