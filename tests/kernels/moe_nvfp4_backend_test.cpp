// The CUDA Backend's prepare_moe / moe with NVFP4 experts on a shape that needs padding (hidden
// 208 → 256, inter 80 → 128: codes padded with 0, scales with 0x00), both expert backends, vs
// moe_forward_cpu on the unpadded quantized experts; FP8 experts refused at load.
//
// Tolerance rel L2 < 2e-2 as in moe_nvfp4_test.cpp. The router GEMM runs on the GPU here (bf16
// weights holding the bf16-rounded f32 router exactly, fp32 accumulation), so a top-k choice
// could in principle differ from the CPU's on a near tie; with 8 experts and random routers the
// gaps are far above the fp32 rounding differences.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/moe/moe_cpu.h"
#include "base/error.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_nvfp4_test_util.h"
#include "kernels/moe_test_util.h"

namespace serval::backend {
namespace {

namespace mu = serval::testing::moe_util;

constexpr double kTol = 2e-2;
constexpr int kE = 8, kTopK = 2, kH = 208, kI = 80;

MoeWeights layer_weights(const Tensor& router, QuantizedWeight gate_up, QuantizedWeight down) {
  MoeWeights w;
  w.router = router;
  w.gate_up_q = std::move(gate_up);
  w.down_q = std::move(down);
  w.num_experts = kE;
  w.top_k = kTopK;
  w.hidden = kH;
  w.inter = kI;
  w.routing = kernels::RoutingMethod::kSoftmaxTopK;
  w.renormalize = true;
  w.local_offset = 0;
  w.num_local = kE;
  return w;
}

TEST(MoeNvfp4Backend, PaddedShapeMatchesCpu) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto b = make_cuda_backend();
  ASSERT_TRUE(b);
  mu::Rng rng(41);
  std::vector<float> router(size_t(kE) * kH);
  for (auto& v : router) v = bf16_to_float(float_to_bf16(rng.uniform()));
  mu::HostStack gu(kE, 2 * kI, kH, 1.0f / std::sqrt(float(kH)), 42);
  mu::HostStack dn(kE, kH, kI, 1.0f / std::sqrt(float(kI)), 43);
  const Tensor host_router = host_view(router.data(), DType::kF32, {kE, kH}, nullptr);
  MoeWeights cpu_w = layer_weights(host_router, gu.host_weight(), dn.host_weight());

  for (const char* expert_backend : {"latency", "throughput"}) {
    QuantizedWeight gq = gu.host_weight(), dq = dn.host_weight();
    gq.data = b->upload(gq.data);
    gq.scales = b->upload(gq.scales);
    dq.data = b->upload(dq.data);
    dq.scales = b->upload(dq.scales);
    MoeWeights w = layer_weights(b->upload_weight(host_router), gq, dq);
    w.expert_backend = expert_backend;
    b->prepare_moe(w);
    EXPECT_EQ(w.padded_hidden, 256);
    EXPECT_EQ(w.padded_inter, 128);
    for (int T : {1, 2, 3, 4, 5, 33}) {  // 1..4: the latency backend's GEMV kernels
      std::vector<bf16> x = mu::random_bf16(size_t(T) * kH, 1.0f, rng);
      Tensor xd = b->upload(host_view(x.data(), DType::kBF16, {T, kH}, nullptr));
      Tensor out = b->empty(DType::kBF16, {T, kH});
      mu::cuda_ok(cudaMemset(out.data, 0xFF, out.nbytes()), "poison");
      mu::cuda_ok(cudaDeviceSynchronize(), "poison sync");  // before the backend's stream
      b->moe(xd, w, out);
      std::vector<bf16> got(size_t(T) * kH);
      b->download(out, got.data());
      std::vector<float> xf = mu::to_float(x), ref(size_t(T) * kH);
      moe::moe_forward_cpu(xf.data(), T, cpu_w, ref.data());
      const std::vector<float> gotf = mu::to_float(got);
      for (size_t i = 0; i < gotf.size(); ++i)
        ASSERT_TRUE(std::isfinite(gotf[i])) << expert_backend << " tokens " << T << " " << i;
      EXPECT_LT(mu::rel_l2(gotf, ref), kTol) << expert_backend << " tokens " << T;
    }
  }
}

TEST(MoeNvfp4Backend, Fp8ExpertsRefusedAtLoad) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto b = make_cuda_backend();
  ASSERT_TRUE(b);
  std::vector<uint8_t> gate_up(size_t(kE) * 2 * kI * kH, 0x38), down(size_t(kE) * kH * kI, 0x38);
  auto fp8 = [&](std::vector<uint8_t>& data, int n, int k) {
    QuantizedWeight q;
    q.format = kernels::WeightFormat::kFp8PerTensor;
    q.experts = kE;
    q.n = n;
    q.k = k;
    q.data = b->upload(host_view(data.data(), DType::kF8E4M3, {kE, n, k}, nullptr));
    q.global_scale.assign(kE, 0.01f);
    q.input_scale.assign(kE, 1.0f);
    return q;
  };
  std::vector<float> router(size_t(kE) * kH, 0.5f);
  MoeWeights w =
      layer_weights(b->upload_weight(host_view(router.data(), DType::kF32, {kE, kH}, nullptr)),
                    fp8(gate_up, 2 * kI, kH), fp8(down, kH, kI));
  try {
    b->prepare_moe(w);
    FAIL() << "FP8 experts were accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("FP8 (per-tensor)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MoE experts"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace serval::backend
