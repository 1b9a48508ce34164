// The CUDA Backend's prepare_moe / moe with FP8 (e4m3) experts — per-tensor, per-channel and
// block scales — on shapes that need padding, both expert backends (the latency one also past
// its hand-over to the throughput kernels), an expert-parallel slice, against moe_forward_cpu on
// the checkpoint-layout stacks (fp32 dequantization).
//
// Tolerance rel L2 < 2e-2 for block FP8, as for NVFP4 experts: the GPU rounds the dequantized
// weights, the SwiGLU activations and the block-scale multipliers to bf16 (~2^-9 relative each);
// per-tensor and per-channel weights are exact in bf16 and their scales applied in fp32: 1e-2. The
// router GEMM runs on the GPU (bf16 weights that hold the bf16-rounded router exactly), so a
// near tie could in principle route differently; with random routers the gaps are far larger.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/moe/moe_cpu.h"
#include "base/dtype.h"
#include "base/error.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_test_util.h"

namespace serval::backend {
namespace {

namespace mu = serval::testing::moe_util;
using kernels::WeightFormat;

// Block FP8 rounds its multipliers and the scaled weights to bf16; per-tensor and per-channel
// weights are exact in bf16, leaving the activations' bf16 roundings (~3e-3 expected).
constexpr double kBlockTol = 2e-2, kExactTol = 1e-2;

struct Fp8Case {
  WeightFormat format;
  int experts, top_k, hidden, inter;
  int block_n = 0, block_k = 0;         // block FP8
  int local_offset = 0, num_local = 0;  // 0 local: all experts
  uint64_t seed;
  const char* name;
};

void PrintTo(const Fp8Case& c, std::ostream* os) {
  *os << c.name;
}

// One FP8 stack [experts, rows, k] with random e4m3 codes (every finite value, NaN excluded)
// and scales giving the weights about `weight_rms`.
struct Fp8Stack {
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // block: [E, ceil(rows/bn), ceil(k/bk)]; per-channel: [E, rows]
  QuantizedWeight q;

  Fp8Stack(const Fp8Case& c, int experts, int rows, int k, mu::Rng& rng) {
    codes.resize(size_t(experts) * rows * k);
    for (auto& b : codes) {
      uint8_t v = uint8_t(rng.next() >> 8);
      if ((v & 0x7F) == 0x7F) v ^= 0x01;  // e4m3fn NaN → its neighbour
      b = v;
    }
    // Random codes have rms ≈ 140; these scales vary per block / row / expert by ×[0.5, 2).
    const float base = 1.0f / (140.0f * std::sqrt(float(k)));
    auto draw = [&] { return base * (1.25f + 0.75f * rng.uniform()); };
    q.format = c.format;
    q.experts = experts;
    q.n = rows;
    q.k = k;
    q.data = host_view(codes.data(), DType::kF8E4M3, {experts, rows, k}, nullptr);
    q.input_scale.assign(size_t(experts), 1.0f);
    q.global_scale.assign(size_t(experts), 1.0f);
    switch (c.format) {
      case WeightFormat::kFp8PerTensor:
        for (auto& s : q.global_scale) s = draw();
        break;
      case WeightFormat::kFp8PerChannel:
        scales.resize(size_t(experts) * rows);
        for (auto& s : scales) s = draw();
        q.scales = host_view(scales.data(), DType::kF32, {experts, rows}, nullptr);
        break;
      case WeightFormat::kFp8Block: {
        const int br = (rows + c.block_n - 1) / c.block_n, bc = (k + c.block_k - 1) / c.block_k;
        scales.resize(size_t(experts) * br * bc);
        for (auto& s : scales) s = draw();
        q.scales = host_view(scales.data(), DType::kF32, {experts, br, bc}, nullptr);
        q.block_n = c.block_n;
        q.block_k = c.block_k;
        break;
      }
      default:
        throw std::invalid_argument("Fp8Stack: not an FP8 format");
    }
  }
};

MoeWeights layer_weights(const Fp8Case& c, const Tensor& router, QuantizedWeight gate_up,
                         QuantizedWeight down) {
  MoeWeights w;
  w.router = router;
  w.gate_up_q = std::move(gate_up);
  w.down_q = std::move(down);
  w.num_experts = c.experts;
  w.top_k = c.top_k;
  w.hidden = c.hidden;
  w.inter = c.inter;
  w.routing = kernels::RoutingMethod::kSoftmaxTopK;
  w.renormalize = true;
  w.local_offset = c.local_offset;
  w.num_local = c.num_local > 0 ? c.num_local : c.experts;
  return w;
}

QuantizedWeight upload_stack(Backend& b, const QuantizedWeight& host) {
  QuantizedWeight q = host;
  q.data = b.upload(host.data);
  if (host.scales.data) q.scales = b.upload(host.scales);
  return q;
}

void expect_matches_cpu(const Fp8Case& c) {
  auto b = make_cuda_backend();
  ASSERT_TRUE(b);
  mu::Rng rng(c.seed);
  const int local = c.num_local > 0 ? c.num_local : c.experts;
  std::vector<float> router(size_t(c.experts) * c.hidden);
  for (auto& v : router) v = bf16_to_float(float_to_bf16(rng.uniform()));
  const Tensor host_router = host_view(router.data(), DType::kF32, {c.experts, c.hidden}, nullptr);
  const Fp8Stack gu(c, local, 2 * c.inter, c.hidden, rng), dn(c, local, c.hidden, c.inter, rng);
  const MoeWeights cpu_w = layer_weights(c, host_router, gu.q, dn.q);

  for (const char* expert_backend : {"latency", "throughput"}) {
    MoeWeights w = layer_weights(c, b->upload_weight(host_router), upload_stack(*b, gu.q),
                                 upload_stack(*b, dn.q));
    w.expert_backend = expert_backend;
    b->prepare_moe(w);
    // 1-8: tile-8 latency GEMMs; 33: tile 16; 130 and 1024: past the latency backend's
    // hand-over at top-2 of 8 experts (128 tokens), i.e. the throughput kernels either way.
    for (int T : {1, 2, 3, 8, 33, 130, 1024}) {
      std::vector<bf16> x = mu::random_bf16(size_t(T) * c.hidden, 1.0f, rng);
      Tensor xd = b->upload(host_view(x.data(), DType::kBF16, {T, c.hidden}, nullptr));
      Tensor out = b->empty(DType::kBF16, {T, c.hidden});
      mu::cuda_ok(cudaMemset(out.data, 0xFF, out.nbytes()), "poison");
      mu::cuda_ok(cudaDeviceSynchronize(), "poison sync");  // before the backend's stream
      b->moe(xd, w, out);
      std::vector<bf16> got(size_t(T) * c.hidden);
      b->download(out, got.data());
      std::vector<float> xf = mu::to_float(x), ref(size_t(T) * c.hidden);
      moe::moe_forward_cpu(xf.data(), T, cpu_w, ref.data());
      const std::vector<float> gotf = mu::to_float(got);
      for (size_t i = 0; i < gotf.size(); ++i)
        ASSERT_TRUE(std::isfinite(gotf[i])) << c.name << " " << expert_backend << " T " << T;
      const double tol = c.format == WeightFormat::kFp8Block ? kBlockTol : kExactTol;
      EXPECT_LT(mu::rel_l2(gotf, ref), tol) << c.name << " " << expert_backend << " T " << T;
    }
  }
}

class MoeFp8Backend : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(MoeFp8Backend, MatchesCpu) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  expect_matches_cpu(GetParam());
}

// hidden 208 → 256 and inter 80 → 128: codes padded with zeros, the gate and up halves apart.
// Blocks of 32 × 64: K of GEMM1 (208) and GEMM2 (80) end in partial blocks, and the up half's
// rows start inside a block; 128 × 128 as DeepSeek-V3 and Qwen3 FP8 ship them; an expert-parallel
// slice (experts [3, 7): tokens routed elsewhere contribute zero); top-8 of 64 experts, whose
// few-token grids take the 64-row tile-8 kernel on an H100/H200.
INSTANTIATE_TEST_SUITE_P(
    Formats, MoeFp8Backend,
    ::testing::Values(
        Fp8Case{WeightFormat::kFp8PerTensor, 8, 2, 208, 80, 0, 0, 0, 0, 61, "PerTensor"},
        Fp8Case{WeightFormat::kFp8PerChannel, 8, 2, 208, 80, 0, 0, 0, 0, 62, "PerChannel"},
        Fp8Case{WeightFormat::kFp8Block, 8, 2, 208, 80, 32, 64, 0, 0, 63, "Block32x64"},
        Fp8Case{WeightFormat::kFp8Block, 8, 2, 256, 256, 128, 128, 0, 0, 64, "Block128"},
        Fp8Case{WeightFormat::kFp8Block, 8, 2, 208, 80, 16, 16, 3, 4, 65, "SliceBlock16"},
        Fp8Case{WeightFormat::kFp8Block, 64, 8, 256, 256, 128, 128, 0, 0, 67, "Block128Top8Of64"}),
    [](const ::testing::TestParamInfo<Fp8Case>& info) { return std::string(info.param.name); });

// A block height that is not a multiple of 16 cannot be applied per 16-row fragment: refused at
// load, naming the block.
TEST(MoeFp8BackendLoad, BlockOf24RowsRefused) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto b = make_cuda_backend();
  ASSERT_TRUE(b);
  const Fp8Case c{WeightFormat::kFp8Block, 8, 2, 208, 80, 24, 64, 0, 0, 66, "Block24"};
  mu::Rng rng(c.seed);
  std::vector<float> router(size_t(c.experts) * c.hidden, 0.5f);
  const Fp8Stack gu(c, c.experts, 2 * c.inter, c.hidden, rng),
      dn(c, c.experts, c.hidden, c.inter, rng);
  MoeWeights w = layer_weights(
      c, b->upload_weight(host_view(router.data(), DType::kF32, {c.experts, c.hidden}, nullptr)),
      upload_stack(*b, gu.q), upload_stack(*b, dn.q));
  try {
    b->prepare_moe(w);
    FAIL() << "a 24-row block was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("24"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace serval::backend
