// CUDA NVFP4 activation quantization against the CPU twin, bit for bit: outputs poisoned (0xFF)
// before every call, every real byte compared, every scale-factor padding byte checked zero, and
// guard bytes after each output checked untouched. Nvfp4QuantBench.DISABLED_Bandwidth times the
// kernel against the previous one (run with --gtest_also_run_disabled_tests
// --gtest_filter='Nvfp4QuantBench.*').
#include "kernels/cuda/quant/nvfp4_quant.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/nvfp4_quant.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gemm_bench_util.h"
#include "kernels/gpu_test_support.h"

namespace serval::testing {
namespace {

using kernels::nvfp4_sf_bytes;
using kernels::nvfp4_sf_cols;
using kernels::nvfp4_sf_offset_128x4;
using kernels::nvfp4_sf_rows;
using kernels::Nvfp4SfLayout;

constexpr size_t kGuardBytes = 64;  // poisoned bytes after each output that must stay 0xFF
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Input {
  int m, n;
  DType dtype;  // kBF16 or kF16
  std::vector<uint16_t> bits;
  float g;  // global scale
};

uint16_t to_bits(float f, DType t) {
  return t == DType::kBF16 ? float_to_bf16(f).bits : float_to_f16(f).bits;
}
float from_bits(uint16_t b, DType t) {
  return t == DType::kBF16 ? bf16_to_float(bf16{b}) : f16_to_float(f16{b});
}

// g = 448·6 / amax(finite |x|) · g_factor, as a calibrated input_scale would give (g_factor > 1
// makes the largest blocks saturate their scale at 448).
float calibrated_scale(const Input& in, float g_factor) {
  float amax = 0;
  for (uint16_t b : in.bits) {
    const float f = std::fabs(from_bits(b, in.dtype));
    if (std::isfinite(f)) amax = std::max(amax, f);
  }
  return amax > 0 ? 448.0f * 6.0f / amax * g_factor : 1.0f;
}

// Blocks of normal values scaled by 2^[-18, 6] (so scales range from 0 and e4m3 subnormals to
// the top), with some all-zero blocks and some blocks holding one large outlier.
Input random_input(int m, int n, DType dtype, uint32_t seed, float g_factor) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-18, 6), kind(0, 15);
  Input in{m, n, dtype, std::vector<uint16_t>(size_t(m) * n), 0.0f};
  for (size_t b = 0; b < in.bits.size() / 16; ++b) {
    const int k = kind(rng);
    const float mag = std::ldexp(1.0f, exponent(rng));
    for (int i = 0; i < 16; ++i) {
      float v = k == 0 ? 0.0f : normal(rng) * mag;
      if (k == 1 && i == 5) v *= 64.0f;  // outlier
      in.bits[b * 16 + i] = to_bits(v, dtype);
    }
  }
  in.g = calibrated_scale(in, g_factor);
  return in;
}

// Runs the CPU twin and the CUDA kernel on `in` and compares every output byte.
void check_case(const Input& in, Nvfp4SfLayout layout) {
  const bool swizzled = layout == Nvfp4SfLayout::kSwizzled128x4;
  SCOPED_TRACE(::testing::Message()
               << "m=" << in.m << " n=" << in.n << " dtype=" << dtype_name(in.dtype)
               << " g=" << in.g << (swizzled ? " swizzled" : " linear"));
  const int m = in.m, n = in.n, sf_cols_real = n / 16;
  const size_t q_bytes = size_t(m) * n / 2, sf_bytes = size_t(nvfp4_sf_bytes(m, n, layout));

  // CPU twin; 0xAB fill so a byte it failed to write would show.
  std::vector<uint8_t> want_q(q_bytes, 0xAB), want_sf(sf_bytes, 0xAB);
  kernels::cpu::nvfp4_quant(
      {in.bits.data(), in.dtype, in.g, want_q.data(), want_sf.data(), layout, m, n});

  DeviceBuffer<uint16_t> d_x(in.bits);
  DeviceBuffer<float> d_g(std::vector<float>{in.g});
  DeviceBuffer<uint8_t> d_q(q_bytes + kGuardBytes), d_sf(sf_bytes + kGuardBytes);
  d_q.poison();
  d_sf.poison();
  kernels::cuda::nvfp4_quant({d_x.get(), in.dtype, d_g.get(), d_q.get(), d_sf.get(), layout, m, n},
                             nullptr);
  cuda_check(cudaGetLastError(), "nvfp4_quant");
  const std::vector<uint8_t> got_q = d_q.download(), got_sf = d_sf.download();

  int bad = 0;
  for (size_t i = 0; i < q_bytes; ++i) {
    if (got_q[i] != want_q[i] && ++bad <= 5) {
      const size_t row = i / (n / 2), col = 2 * (i % (n / 2));
      ADD_FAILURE() << "q byte " << i << " (row " << row << ", elements " << col << ".." << col + 1
                    << "): gpu 0x" << std::hex << int(got_q[i]) << " cpu 0x" << int(want_q[i]);
    }
  }
  EXPECT_EQ(bad, 0) << "q bytes differing";
  for (size_t i = q_bytes; i < q_bytes + kGuardBytes; ++i) {
    ASSERT_EQ(got_q[i], 0xFF) << "q written past its end at byte " << i;
  }

  // Every SF byte of the (padded) buffer: real ones equal the CPU's, padding ones are zero.
  bad = 0;
  const int64_t rows = nvfp4_sf_rows(m, layout), cols = nvfp4_sf_cols(n, layout);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t off =
          swizzled ? nvfp4_sf_offset_128x4<int64_t>(r, k, sf_cols_real) : r * sf_cols_real + k;
      const bool padding = r >= m || k >= sf_cols_real;
      const uint8_t want = padding ? 0x00 : want_sf[off];
      if (padding && want_sf[off] != 0x00) {
        ADD_FAILURE() << "cpu twin left padding at " << r << "," << k;
      }
      if (got_sf[off] != want && ++bad <= 5) {
        ADD_FAILURE() << (padding ? "padding " : "") << "sf row " << r << " col " << k << ": gpu 0x"
                      << std::hex << int(got_sf[off]) << " want 0x" << int(want);
      }
    }
  }
  EXPECT_EQ(bad, 0) << "sf bytes differing";
  for (size_t i = sf_bytes; i < sf_bytes + kGuardBytes; ++i) {
    ASSERT_EQ(got_sf[i], 0xFF) << "sf written past its end at byte " << i;
  }
}

TEST(CudaNvfp4Quant, Bf16MatchesCpuBitExact) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // g_factor: calibrated, saturating (8x: the largest blocks clamp sf to 448), and an odd one.
  const float g_factors[] = {1.0f, 8.0f, 0.37f};
  int i = 0;
  for (int m : {1, 7, 127, 128, 129, 1000, 4096}) {
    for (int n : {16, 48, 64, 4096, 4112}) {
      const Input in = random_input(m, n, DType::kBF16, uint32_t(m * 7919 + n), g_factors[i++ % 3]);
      check_case(in, Nvfp4SfLayout::kSwizzled128x4);
      check_case(in, Nvfp4SfLayout::kLinear);
    }
  }
}

TEST(CudaNvfp4Quant, Float16MatchesCpuBitExact) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  // m = 256 with n = 64: whole 128x64 tiles, the kernel variant without bounds checks; m = 2048:
  // more tiles than the persistent grid has CTAs (<= 4 per SM), so CTAs loop over several tiles.
  for (int m : {1, 129, 256, 1000, 2048}) {
    for (int n : {16, 48, 64, 4112}) {
      const Input in =
          random_input(m, n, DType::kF16, uint32_t(m * 31 + n), m == 129 ? 8.0f : 1.0f);
      check_case(in, Nvfp4SfLayout::kSwizzled128x4);
      check_case(in, Nvfp4SfLayout::kLinear);
    }
  }
}

// Hand-built blocks with g = 6, so that sf = e4m3(amax) and, where amax = 6·2^j, scale = 2^-j
// exactly: E2M1 ties and their neighbours land exactly, E4M3 scale ties, saturation, subnormal
// and zero scales, inf and NaN (rules in kernels/cpu/nvfp4_quant.h), -0 and tiny negatives.
std::vector<std::vector<float>> special_blocks() {
  std::vector<std::vector<float>> blocks;
  blocks.push_back(std::vector<float>(16, 0.0f));
  std::vector<float> near_ties;
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
    const uint16_t b = float_to_bf16(t).bits;
    near_ties.insert(near_ties.end(), {t, bf16_to_float(bf16{uint16_t(b + 1)}),
                                       bf16_to_float(bf16{uint16_t(b - 1)})});
  }
  for (int j = -8; j <= 6; j += 2) {
    for (size_t start = 0; start < near_ties.size(); start += 15) {
      std::vector<float> blk(16, 0.0f);
      blk[(start / 15 * 5 + 3) % 16] = 6.0f * std::ldexp(1.0f, j);
      for (size_t i = 0, slot = 0; i < 15 && start + i < near_ties.size(); ++i, ++slot) {
        if (blk[slot] != 0) ++slot;
        const float sign = (i % 3 == 1) ? -1.0f : 1.0f;
        blk[slot] = sign * near_ties[start + i] * std::ldexp(1.0f, j);
      }
      blocks.push_back(blk);
    }
  }
  // E4M3 scale ties: amax at the midpoint of neighbouring e4m3 values (and one bf16 ulp off).
  for (int c = 0; c < 0x7E; c += 1) {
    const float mid = (e4m3_to_float(uint8_t(c)) + e4m3_to_float(uint8_t(c + 1))) / 2;
    const uint16_t mb = float_to_bf16(mid).bits;
    const uint16_t amax_bits = uint16_t(mb + (c % 3) - 1);  // below, at, above the midpoint
    std::vector<float> blk(16);
    for (int i = 0; i < 16; ++i) blk[i] = bf16_to_float(bf16{amax_bits}) * float(i - 7) / 9.0f;
    blk[c % 16] = bf16_to_float(bf16{amax_bits});
    blocks.push_back(blk);
  }
  for (float amax : {440.0f, 448.0f, 456.0f, 464.0f, 480.0f, 1000.0f, 60000.0f, 3.0e38f, 0x1p-10f,
                     0x1.02p-10f, 0x1.8p-10f, 0x1p-9f, 0x1.8p-9f, 0x1p-12f, 1e-39f}) {
    std::vector<float> blk(16);
    for (int i = 0; i < 16; ++i) blk[i] = amax * float(15 - i) / 15.0f * ((i % 2) ? -1.0f : 1.0f);
    blocks.push_back(blk);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> blk(16, 0.0f);
  blk[0] = kInf;  // sf saturates at 448, inf -> 6
  blk[1] = 1;
  blk[2] = -2;
  blk[3] = nan;
  blk[4] = -nan;
  blk[9] = 300;
  blocks.push_back(blk);
  blk.assign(16, 0.5f);
  blk[7] = -kInf;
  blk[8] = nan;
  blocks.push_back(blk);
  blk.assign(16, 0.0f);
  blk[11] = nan;  // amax 0: whole block 0
  blocks.push_back(blk);
  blk[4] = 3;  // amax 3, NaN -> code 7
  blocks.push_back(blk);
  blk.assign(16, -0.0f);
  blk[0] = 4;
  blk[1] = -1e-3f;  // rounds to -0: code 0x8
  blk[2] = -0.2f;
  blk[3] = 0.2f;
  blocks.push_back(blk);
  return blocks;
}

Input special_input(int n, int min_rows, DType dtype) {
  const auto blocks = special_blocks();
  const int per_row = n / 16;
  const int m = std::max(min_rows, int((blocks.size() + per_row - 1) / per_row));
  Input in = random_input(m, n, dtype, 7u + uint32_t(n), 1.0f);  // fills the rest
  for (size_t b = 0; b < blocks.size(); ++b)
    for (int i = 0; i < 16; ++i) in.bits[b * 16 + i] = to_bits(blocks[b][i], dtype);
  in.g = 6.0f;
  return in;
}

TEST(CudaNvfp4Quant, TiesSaturationTinyScalesInfNaNMatchCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    // n = 64: 4 SF columns; 1 row minimum gives a padded grid, 128 rows the no-padding variant.
    for (int min_rows : {1, 128}) {
      const Input in = special_input(64, min_rows, dtype);
      check_case(in, Nvfp4SfLayout::kSwizzled128x4);
      check_case(in, Nvfp4SfLayout::kLinear);
    }
    const Input wide = special_input(4112, 1, dtype);
    check_case(wide, Nvfp4SfLayout::kSwizzled128x4);
  }
}

// Host-side argument checks happen before any CUDA call, so this runs without a GPU too.
TEST(CudaNvfp4Quant, RejectsBadArguments) {
  alignas(16) static uint8_t buf[4096];
  const float g = 1.0f;
  auto params = [&](int m, int n, const void* x, DType t) {
    return kernels::cuda::Nvfp4QuantParams{x, t, &g, buf, buf, Nvfp4SfLayout::kSwizzled128x4, m, n};
  };
  EXPECT_THROW(kernels::cuda::nvfp4_quant(params(1, 24, buf, DType::kBF16), nullptr),
               InvalidArgument);
  EXPECT_THROW(kernels::cuda::nvfp4_quant(params(1, 16, buf, DType::kF32), nullptr),
               InvalidArgument);
  EXPECT_THROW(kernels::cuda::nvfp4_quant(params(1, 16, buf + 2, DType::kBF16), nullptr),
               InvalidArgument);
  EXPECT_THROW(kernels::cuda::nvfp4_quant(params(1, 16, nullptr, DType::kBF16), nullptr),
               InvalidArgument);
  auto misaligned_sf = params(1, 16, buf, DType::kBF16);
  misaligned_sf.sf = buf + 4;  // the swizzled SF tiles are stored 16 bytes at a time
  EXPECT_THROW(kernels::cuda::nvfp4_quant(misaligned_sf, nullptr), InvalidArgument);
}

// Bandwidth and latency: 50 launches captured in one CUDA graph (graph_us), cycling over enough
// input copies that the inputs of the bandwidth shapes cannot stay in L2; the decode shapes (m = 1,
// 8, 64) use one hot copy, as after the kernel that produced the activations, and are reported in
// µs. Bytes = m·n·2 (read) + m·n/2 + SF bytes (written), compared with a device-to-device copy
// timed the same way (read + write bytes).
TEST(Nvfp4QuantBench, DISABLED_Bandwidth) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  constexpr int kCalls = 50;
  const size_t copy_bytes = size_t(256) << 20;
  DeviceBuffer<uint8_t> src(copy_bytes), dst(copy_bytes);
  const double copy_us = cold_graph_us(
      1,
      [&](cudaStream_t s, int) {
        cuda_check(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, s),
                   "copy");
      },
      kCalls);
  const double copy_tbps = 2.0 * double(copy_bytes) / (copy_us * 1e-6) / 1e12;
  std::printf("device copy 256 MiB (graph): %.1f us, %.3f TB/s (read + write)\n", copy_us,
              copy_tbps);

  struct Shape {
    int m, n;
    bool bandwidth;  // cold inputs and a TB/s figure; else one hot copy, µs only
  };
  const Shape shapes[] = {{8192, 8192, true}, {1000, 4112, true}, {1, 2048, false},
                          {1, 8192, false},   {8, 2048, false},   {8, 8192, false},
                          {64, 2048, false},  {64, 8192, false}};
  for (const Shape& sh : shapes) {
    const int m = sh.m, n = sh.n;
    const size_t x_elems = size_t(m) * n;
    const int copies = sh.bandwidth ? cold_copies(x_elems * 2) : 1;
    const auto x = random_bf16(x_elems, 1234, -4.0f, 4.0f);
    std::vector<std::unique_ptr<DeviceBuffer<bf16>>> d_x;
    for (int i = 0; i < copies; ++i) d_x.push_back(std::make_unique<DeviceBuffer<bf16>>(x));
    DeviceBuffer<float> d_g(std::vector<float>{448.0f * 6.0f / 4.0f});
    for (Nvfp4SfLayout layout : {Nvfp4SfLayout::kSwizzled128x4, Nvfp4SfLayout::kLinear}) {
      if (!sh.bandwidth && layout == Nvfp4SfLayout::kLinear) continue;  // the GEMMs read swizzled
      const size_t sf_bytes = size_t(nvfp4_sf_bytes(m, n, layout));
      DeviceBuffer<uint8_t> d_q(x_elems / 2), d_sf(sf_bytes);
      const double us = cold_graph_us(
          copies,
          [&](cudaStream_t s, int i) {
            kernels::cuda::nvfp4_quant({d_x[size_t(i)]->get(), DType::kBF16, d_g.get(), d_q.get(),
                                        d_sf.get(), layout, m, n},
                                       s);
          },
          kCalls);
      cuda_check(cudaDeviceSynchronize(), "nvfp4_quant");
      const char* name = layout == Nvfp4SfLayout::kLinear ? "linear" : "swizzled";
      if (!sh.bandwidth) {
        std::printf("nvfp4_quant m=%d n=%d %s: %.2f us\n", m, n, name, us);
        continue;
      }
      const double bytes = double(x_elems) * 2 + double(x_elems) / 2 + double(sf_bytes);
      std::printf("nvfp4_quant m=%d n=%d %s (%d input copies): %.2f us = %.0f%% of copy\n", m, n,
                  name, copies, us, 100.0 * bytes / (us * 1e-6) / 1e12 / copy_tbps);
    }
  }
}

}  // namespace
}  // namespace serval::testing
