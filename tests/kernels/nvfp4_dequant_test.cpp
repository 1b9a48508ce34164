// W4A4 emulation on the GPU: nvfp4_quant (linear scales) then nvfp4_dequant gives, bit for bit,
// the CPU twin kernels::cpu::nvfp4_fake_quant_rows rounded to bf16; outputs poisoned first.
#include "kernels/cuda/quant/nvfp4_dequant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/nvfp4_quant.h"
#include "kernels/cuda/quant/nvfp4_quant.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

TEST(CudaNvfp4Dequant, QuantDequantEqualsCpuFakeQuant) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (auto [m, n] :
       {std::pair{1, 16}, std::pair{7, 64}, std::pair{33, 2048}, std::pair{129, 4112}}) {
    std::vector<bf16> x = random_bf16(size_t(m) * n, uint32_t(m * 131 + n), -4.0f, 4.0f);
    // A few outliers so some blocks use large scales.
    for (size_t i = 0; i < x.size(); i += 97) x[i] = float_to_bf16(bf16_to_float(x[i]) * 40.0f);
    const std::vector<float> xf = to_float(x);
    float amax = 0;
    for (float v : xf) amax = std::max(amax, std::fabs(v));
    const float g = 448.0f * 6.0f / amax;

    std::vector<float> want(xf.size());
    kernels::cpu::nvfp4_fake_quant_rows(xf.data(), m, n, g, want.data());

    DeviceBuffer<bf16> dx(x);
    DeviceBuffer<float> dg(std::vector<float>{g});
    DeviceBuffer<uint8_t> dq(size_t(m) * n / 2), dsf(size_t(m) * n / 16);
    DeviceBuffer<bf16> dout(size_t(m) * n);
    dq.poison();
    dsf.poison();
    dout.poison();
    kernels::cuda::nvfp4_quant({dx.get(), DType::kBF16, dg.get(), dq.get(), dsf.get(),
                                kernels::Nvfp4SfLayout::kLinear, m, n},
                               nullptr);
    kernels::cuda::nvfp4_dequant({dq.get(), dsf.get(), dg.get(), dout.get(), m, n}, nullptr);
    const std::vector<bf16> got = dout.download();
    int mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i].bits != float_to_bf16(want[i]).bits && ++mismatches <= 5)
        ADD_FAILURE() << "m " << m << " n " << n << " element " << i << ": gpu "
                      << bf16_to_float(got[i]) << " cpu " << want[i];
    }
    EXPECT_EQ(mismatches, 0) << "m " << m << " n " << n;
  }
}

}  // namespace
}  // namespace serval::testing
