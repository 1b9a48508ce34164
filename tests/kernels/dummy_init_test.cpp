// Dummy weights generated on the GPU (--load-format dummy): the raw kernels equal their CPU twins
// bit for bit (outputs poisoned first), and the CUDA backend's dummy_dense / dummy_quantized give
// the host fallback's dense values exactly and quantized weights in the GEMM layouts with zero
// padding and the intended spread (dequantized std 0.02).
#include "kernels/cuda/init/dummy_init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/quantized_pack.h"
#include "kernels/bench_timing.h"
#include "kernels/cpu/dummy_init.h"
#include "kernels/cuda/gemm/quant_gemm.h"
#include "kernels/cuda_test_util.h"
#include "kernels/dummy_random.h"
#include "kernels/gpu_test_support.h"
#include "model/weight_source.h"
#include "quant/quant_config.h"

namespace serval::testing {
namespace {

using kernels::WeightFormat;

std::vector<uint8_t> bytes_of(const std::vector<bf16>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The host twin in `source`, then the bf16 conversion upload_weight applies.
std::vector<bf16> host_dense(DType source, int64_t rows, int64_t cols, uint64_t key, int64_t offset,
                             int64_t row_stride, float center, float half_width) {
  Tensor t = host_empty(source, {rows, cols});
  kernels::cpu::dummy_dense(t.data, source, rows, cols, key, offset, row_stride, center,
                            half_width);
  std::vector<bf16> out(size_t(rows * cols));
  for (size_t i = 0; i < out.size(); ++i) out[i] = float_to_bf16(load_as_float(t.data, source, i));
  return out;
}

TEST(CudaDummyInit, DenseEqualsCpuTwinBitExactly) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  struct Case {
    DType source;
    int64_t rows, cols, offset, row_stride;
    float center, half_width;
  };
  const uint64_t key = 0x1234'5678'9abc'def0ull ^ std::hash<std::string>{}("w");
  for (const Case& c : {Case{DType::kBF16, 1, 4096, 0, 4096, 0.0f, 0.02f * 1.7320508f},
                        Case{DType::kBF16, 37, 61, 5 * 200 + 17, 200, 0.0f, 0.0346f},
                        Case{DType::kF32, 300, 129, 0, 129, 1.0f, 0.05f * 1.7320508f},
                        Case{DType::kF16, 64, 100, 3, 300, 0.0f, 0.0346f}}) {
    DeviceBuffer<bf16> out(size_t(c.rows * c.cols));
    out.poison();
    kernels::cuda::dummy_dense(
        {out.get(), c.rows, c.cols, key, c.offset, c.row_stride, c.center, c.half_width, c.source},
        nullptr);
    const std::vector<bf16> got = out.download();
    const std::vector<bf16> want =
        host_dense(c.source, c.rows, c.cols, key, c.offset, c.row_stride, c.center, c.half_width);
    EXPECT_EQ(bytes_of(got), bytes_of(want))
        << dtype_name(c.source) << " " << c.rows << "x" << c.cols << " offset " << c.offset;
  }
}

TEST(CudaDummyInit, DenseStatistics) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const int64_t n = int64_t(1) << 22;
  DeviceBuffer<bf16> out(static_cast<size_t>(n));
  out.poison();
  kernels::cuda::dummy_dense({out.get(), 1, n, 99, 0, n, 0.0f, 0.02f * 1.7320508f, DType::kBF16},
                             nullptr);
  double sum = 0, sq = 0;
  for (bf16 v : out.download()) {
    const double f = bf16_to_float(v);
    sum += f, sq += f * f;
  }
  const double mean = sum / double(n), std = std::sqrt(sq / double(n) - mean * mean);
  // 4M uniform values: sampling errors ~1e-5 on the mean, ~0.05 % on the std.
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std, 0.02, 0.0002);
}

TEST(CudaDummyInit, BytesAndCodesEqualCpuTwins) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (int64_t n : {int64_t(8), int64_t(1003), int64_t(1) << 16}) {
    // A mask keeping alternate nibbles / bytes.
    std::vector<uint8_t> mask(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mask[size_t(i)] = (i / 3) % 2 ? 0xFF : 0x0F;
    DeviceBuffer<uint8_t> dmask(mask);
    for (bool fp8 : {false, true}) {
      for (bool masked : {false, true}) {
        DeviceBuffer<uint8_t> out(static_cast<size_t>(n));
        out.poison();
        kernels::cuda::dummy_bytes({out.get(), masked ? dmask.get() : nullptr, n, 777, fp8, 448.0f},
                                   nullptr);
        std::vector<uint8_t> want(static_cast<size_t>(n));
        if (fp8) {
          kernels::cpu::dummy_fp8(want.data(), n, 777, 448.0f);
        } else {
          kernels::cpu::dummy_bits(want.data(), n, 777);
        }
        if (masked)
          for (size_t i = 0; i < want.size(); ++i) want[i] &= mask[i];
        std::vector<uint8_t> got = out.download();
        if (fp8) {
          // Values that round to zero keep their sign on the host (0x80); the hardware conversion
          // may not: both are zero weights, so compare zeros unsigned.
          for (uint8_t& b : got) b = b == 0x80 ? 0 : b;
          for (uint8_t& b : want) b = b == 0x80 ? 0 : b;
        }
        EXPECT_EQ(got, want) << "n " << n << (fp8 ? " fp8" : " bits") << (masked ? " masked" : "");
      }
    }
  }
  // Codes [rows, cols] inside a zero-padded [out_rows, out_cols].
  const int64_t rows = 45, cols = 7, out_rows = 64, out_cols = 8;
  DeviceBuffer<uint8_t> out(size_t(out_rows * out_cols));
  out.poison();
  kernels::cuda::dummy_codes({out.get(), rows, cols, out_rows, out_cols, 31, 0x78, 0x7E}, nullptr);
  std::vector<uint8_t> logical(size_t(rows * cols));
  kernels::cpu::dummy_codes(logical.data(), rows * cols, 31, 0x78, 0x7E);
  std::vector<uint8_t> want(size_t(out_rows * out_cols), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      want[size_t(r * out_cols + c)] = logical[size_t(r * cols + c)];
  EXPECT_EQ(out.download(), want);
}

// Fills the CUDA backend's memory pool with 0xFF so its next allocations start poisoned.
void poison_pool(backend::Backend& b, int64_t bytes) {
  Tensor t = b.empty(DType::kU8, {bytes});
  cuda_check(cudaDeviceSynchronize(), "poison pool");  // the allocation is ordered on b's stream
  cuda_check(cudaMemset(t.data, 0xFF, size_t(bytes)), "poison pool");
  cuda_check(cudaDeviceSynchronize(), "poison pool");
}

template <typename T>
std::vector<T> download(backend::Backend& b, const Tensor& t) {
  std::vector<T> host(t.nbytes() / sizeof(T));
  b.download(t, host.data());
  return host;
}

TEST(CudaDummyInit, BackendDenseEqualsHostFallback) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto gpu = backend::make_cuda_backend();
  auto cpu = backend::make_cpu_backend();
  ASSERT_TRUE(gpu->generates_dummy_weights());
  // Two runs of rows from different tensors (a fused q/k slice), as the loader builds them.
  backend::DummyDense d;
  d.dtype = DType::kBF16;
  d.shape = {96, 130};
  d.cols = 130;
  d.blocks = {{64, 5, 10 * 260 + 7, 260, 0.0f, 0.0346f}, {32, 6, 0, 130, 1.0f, 0.0866f}};
  poison_pool(*gpu, 1 << 20);
  const Tensor got = gpu->dummy_dense(d);
  ASSERT_EQ(got.dtype, DType::kBF16);
  ASSERT_EQ(got.shape, d.shape);
  const Tensor want = cpu->dummy_dense(d);  // host memory, bf16
  std::vector<uint8_t> want_bytes(want.nbytes());
  std::memcpy(want_bytes.data(), want.data, want.nbytes());
  EXPECT_EQ(download<uint8_t>(*gpu, got), want_bytes);
}

// The dummy recipe of an NVFP4 (ModelOpt-style) or FP8 per-channel source, as the loader gets it.
backend::DummyQuantized recipe(quant::QuantConfig::Method method, int experts, int n, int k) {
  quant::QuantConfig q;
  q.method = method;
  q.group_size = method == quant::QuantConfig::Method::kNvfp4 ? 16 : 0;
  q.source = "dummy_init_test";
  auto w = model::make_dummy_weights(DType::kBF16, 5, q);
  backend::DummyQuantized d = w->dummy_quantized("model.layers.0.mlp.experts.down_proj");
  backend::QuantizedWeight& m = d.meta;
  m.format = method == quant::QuantConfig::Method::kNvfp4 ? WeightFormat::kNvfp4
                                                          : WeightFormat::kFp8PerChannel;
  m.experts = experts;
  m.n = n;
  m.k = k;
  const size_t copies = size_t(experts > 0 ? experts : 1);
  m.global_scale.assign(copies, m.global_scale.at(0));
  m.input_scale.assign(copies, m.input_scale.at(0));
  return d;
}

// Dequantizes a single linear the CUDA backend made (fragment layout) through the GEMM's own
// dequantizer; returns [n, k] as float.
std::vector<float> dequant(backend::Backend& b, const backend::QuantizedWeight& q) {
  (void)download<uint8_t>(b, q.data);  // synchronises the backend's stream
  DeviceBuffer<bf16> out(size_t(q.n) * q.k);
  out.poison();
  kernels::cuda::quant_dequant_bf16(backend::cuda::quant_gemm_weight(q), out.get(), nullptr);
  return to_float(out.download());
}

void expect_std_near_002(const std::vector<float>& v, const char* what) {
  double sum = 0, sq = 0;
  for (float f : v) sum += f, sq += double(f) * f;
  const double mean = sum / double(v.size()), std = std::sqrt(sq / double(v.size()) - mean * mean);
  // ~1M values: sampling errors ~0.1 % of the std; the recipe's rounding (discrete E2M1 values,
  // E4M3 codes) keeps the std within a few % of 0.02.
  EXPECT_NEAR(std, 0.02, 0.0006) << what;
  EXPECT_NEAR(mean, 0.0, 2e-4) << what;
}

TEST(CudaDummyInit, Nvfp4LinearPaddingZeroAndStd) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto gpu = backend::make_cuda_backend();
  // Padded in both n (1000 → 1024) and k (1008 → 1024); and an unpadded shape.
  for (auto [n, k] : {std::pair{1000, 1008}, std::pair{512, 2048}}) {
    SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(k));
    const backend::DummyQuantized d = recipe(quant::QuantConfig::Method::kNvfp4, 0, n, k);
    poison_pool(*gpu, 8 << 20);
    const backend::QuantizedWeight q = gpu->dummy_quantized(d);
    ASSERT_EQ(q.data.nbytes(), kernels::cuda::quant_gemm_data_bytes(WeightFormat::kNvfp4, n, k));
    const int n_pad = kernels::cuda::quant_gemm_n_pad(n),
              cols_pad = kernels::cuda::quant_gemm_k_pad(k) / 16;
    ASSERT_EQ(q.scales.shape, (Shape{n_pad, cols_pad}));
    EXPECT_EQ(q.global_scale, d.meta.global_scale);

    // Codes: zero where the GEMM layout pads (the packer's image of an all-ones weight), each of
    // the 16 codes about equally often elsewhere.
    const std::vector<uint8_t> ones(size_t(n) * k / 2, 0xFF);
    const std::vector<uint8_t> mask =
        kernels::cuda::quant_gemm_pack_data(WeightFormat::kNvfp4, ones.data(), n, k);
    const std::vector<uint8_t> data = download<uint8_t>(*gpu, q.data);
    ASSERT_EQ(data.size(), mask.size());
    std::vector<int64_t> count(16, 0);
    int64_t stray = 0;
    for (size_t i = 0; i < data.size(); ++i) {
      stray += (data[i] & ~mask[i]) != 0;
      for (int h = 0; h < 2; ++h)
        if ((mask[i] >> (4 * h)) & 0xF) ++count[(data[i] >> (4 * h)) & 0xF];
    }
    EXPECT_EQ(stray, 0) << "nonzero codes in the padding";
    const double per_code = double(n) * k / 16;  // >= 63k: ±5 % is > 10 sigma
    for (int c = 0; c < 16; ++c) EXPECT_NEAR(count[c], per_code, 0.05 * per_code) << "code " << c;

    // Block scales: the host packer's tiles of the CPU twin's codes [n, k/16], so codes
    // 0x78..0x7E in place and zero in the padding.
    const std::vector<uint8_t> sf = download<uint8_t>(*gpu, q.scales);
    std::vector<uint8_t> logical(size_t(n) * (k / 16));
    kernels::cpu::dummy_codes(logical.data(), int64_t(logical.size()), d.scale_key, d.sf_code_lo,
                              d.sf_code_hi);
    EXPECT_EQ(sf, kernels::cuda::quant_gemm_pack_nvfp4_scales(logical.data(), n, k));
    int64_t bad = 0, seen[7] = {};
    for (int r = 0; r < n_pad; ++r)
      for (int c = 0; c < cols_pad; ++c) {
        const uint8_t s =
            sf[size_t(kernels::cuda::quant_gemm_nvfp4_scale_offset(r, c, cols_pad / 4))];
        if (r < n && c < k / 16) {
          if (s < 0x78 || s > 0x7E)
            ++bad;
          else
            ++seen[s - 0x78];
        } else {
          bad += s != 0;
        }
      }
    EXPECT_EQ(bad, 0);
    for (int c = 0; c < 7; ++c) EXPECT_GT(seen[c], 0) << "scale code " << (0x78 + c);

    expect_std_near_002(dequant(*gpu, q), "NVFP4 linear");
  }
}

TEST(CudaDummyInit, Nvfp4ExpertStackInCheckpointLayout) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto gpu = backend::make_cuda_backend();
  const int E = 3, n = 64, k = 128;
  const backend::DummyQuantized d = recipe(quant::QuantConfig::Method::kNvfp4, E, n, k);
  poison_pool(*gpu, 1 << 20);
  const backend::QuantizedWeight q = gpu->dummy_quantized(d);
  EXPECT_EQ(q.experts, E);
  ASSERT_EQ(q.data.shape, (Shape{E, n, k / 2}));
  ASSERT_EQ(q.scales.shape, (Shape{E, n, k / 16}));
  EXPECT_EQ(q.scales.dtype, DType::kF8E4M3);
  EXPECT_EQ(q.global_scale.size(), size_t(E));
  // No padding in this layout: the host twins' streams exactly.
  std::vector<uint8_t> want_data(size_t(E) * n * k / 2), want_sf(size_t(E) * n * k / 16);
  kernels::cpu::dummy_bits(want_data.data(), int64_t(want_data.size()), d.data_key);
  kernels::cpu::dummy_codes(want_sf.data(), int64_t(want_sf.size()), d.scale_key, d.sf_code_lo,
                            d.sf_code_hi);
  EXPECT_EQ(download<uint8_t>(*gpu, q.data), want_data);
  EXPECT_EQ(download<uint8_t>(*gpu, q.scales), want_sf);
}

TEST(CudaDummyInit, Fp8PerChannelLinearPaddingZeroAndStd) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto gpu = backend::make_cuda_backend();
  const int n = 1000, k = 1000;  // padded to 1024 × 1024
  const backend::DummyQuantized d = recipe(quant::QuantConfig::Method::kFp8PerChannel, 0, n, k);
  poison_pool(*gpu, 8 << 20);
  const backend::QuantizedWeight q = gpu->dummy_quantized(d);
  const std::vector<uint8_t> ones(size_t(n) * k, 0xFF);
  const std::vector<uint8_t> mask =
      kernels::cuda::quant_gemm_pack_data(WeightFormat::kFp8PerChannel, ones.data(), n, k);
  const std::vector<uint8_t> data = download<uint8_t>(*gpu, q.data);
  ASSERT_EQ(data.size(), mask.size());
  int64_t stray = 0;
  for (size_t i = 0; i < data.size(); ++i) stray += (data[i] & ~mask[i]) != 0;
  EXPECT_EQ(stray, 0) << "nonzero codes in the padding";
  ASSERT_EQ(q.scales.dtype, DType::kF32);
  for (float s : download<float>(*gpu, q.scales)) ASSERT_EQ(s, d.fp8_scale);
  expect_std_near_002(dequant(*gpu, q), "FP8 per-channel linear");
}

// Generation speed on Qwen3-30B-A3B-sized tensors (one layer's bf16 gate_up expert stack, 403 MB,
// and its NVFP4 codes); the floor is the store bandwidth (bytes / 4.3 TB/s).
TEST(CudaDummyInitBench, DISABLED_Throughput) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const int64_t elems = int64_t(128) * 1536 * 2048;
  DeviceBuffer<bf16> dense(static_cast<size_t>(elems));
  DeviceBuffer<uint8_t> codes(size_t(elems / 2));
  auto time_ms = [](const std::function<void()>& f) {
    f();  // warm-up
    return median_event_ms(nullptr, f, 7);
  };
  const float dense_ms = time_ms([&] {
    kernels::cuda::dummy_dense(
        {dense.get(), 1536 * 128, 2048, 1, 0, 2048, 0.0f, 0.0346f, DType::kBF16}, nullptr);
  });
  const float codes_ms = time_ms([&] {
    kernels::cuda::dummy_bytes({codes.get(), nullptr, elems / 2, 1, false, 0.0f}, nullptr);
  });
  const double dense_bytes = double(elems) * 2, code_bytes = double(elems) / 2;
  std::printf("dummy_dense bf16: %.3f ms for %.0f MB = %.2f TB/s (%.0f %% of 4.3 TB/s)\n", dense_ms,
              dense_bytes / 1e6, dense_bytes / dense_ms / 1e9,
              100.0 * dense_bytes / dense_ms / 1e9 / 4.3);
  std::printf("dummy_bytes nvfp4: %.3f ms for %.0f MB = %.2f TB/s (%.0f %% of 4.3 TB/s)\n",
              codes_ms, code_bytes / 1e6, code_bytes / codes_ms / 1e9,
              100.0 * code_bytes / codes_ms / 1e9 / 4.3);
}

}  // namespace
}  // namespace serval::testing
