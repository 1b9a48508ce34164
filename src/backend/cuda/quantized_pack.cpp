#include "backend/cuda/quantized_pack.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "base/error.h"
#include "kernels/cuda/gemm/quant_gemm.h"

namespace serval::backend::cuda {

namespace {

using kernels::WeightFormat;

// The rows of a host array [n, row_bytes] in the gate/up tiled order.
std::vector<uint8_t> gate_up_tiled_rows(const void* src, int n, size_t row_bytes) {
  std::vector<uint8_t> out(size_t(n) * row_bytes);
  for (int r = 0; r < n; ++r) {
    const size_t from = size_t(kernels::cuda::quant_gemm_gate_up_source_row(r, n / 2));
    std::memcpy(out.data() + size_t(r) * row_bytes,
                static_cast<const uint8_t*>(src) + from * row_bytes, row_bytes);
  }
  return out;
}

void expect_scales(const QuantizedWeight& w, DType dtype, int64_t numel, const char* what) {
  if (w.scales.data == nullptr || w.scales.dtype != dtype || w.scales.numel() != numel)
    throw InvalidArgument(std::string("cuda backend: ") + what + " must be " +
                          std::string(dtype_name(dtype)) + " with " + std::to_string(numel) +
                          " values for a [" + std::to_string(w.n) + ", " + std::to_string(w.k) +
                          "] weight");
}

}  // namespace

bool tiles_gate_up(const QuantizedWeight& w) {
  static const bool off = std::getenv("SERVAL_NO_GATE_UP_TILING") != nullptr;
  return !off && w.gate_up && w.experts == 0 && w.n % 32 == 0 &&
         w.format != WeightFormat::kFp8Block;
}

void check_quantized_linear_shape(const QuantizedWeight& w) {
  if (w.experts != 0 || w.n <= 0 || w.k <= 0 || w.k % 8 != 0 ||
      (w.format == WeightFormat::kNvfp4 && w.k % 16 != 0))
    throw InvalidArgument("cuda backend: quantized linear [" + std::to_string(w.n) + ", " +
                          std::to_string(w.k) + "] needs k % 8 == 0 (NVFP4: k % 16 == 0)");
}

PackedLinear pack_quantized_linear(const QuantizedWeight& host) {
  check_quantized_linear_shape(host);
  const int n = host.n, k = host.k;
  const bool nvfp4 = host.format == WeightFormat::kNvfp4;
  const size_t code_row = size_t(nvfp4 ? k / 2 : k);
  if (host.data.data == nullptr || size_t(host.data.nbytes()) != size_t(n) * code_row)
    throw InvalidArgument("cuda backend: quantized linear [" + std::to_string(n) + ", " +
                          std::to_string(k) + "] needs " + std::to_string(size_t(n) * code_row) +
                          " code bytes");
  if (nvfp4) expect_scales(host, DType::kF8E4M3, int64_t(n) * (k / 16), "NVFP4 block scales");
  if (host.format == WeightFormat::kFp8PerChannel)
    expect_scales(host, DType::kF32, n, "FP8 per-channel scales");
  if (host.format == WeightFormat::kFp8Block)
    expect_scales(host, DType::kF32, host.scales.numel(), "FP8 block scales");

  PackedLinear out;
  const void* codes = host.data.data;
  const void* scales = host.scales.data;
  std::vector<uint8_t> tiled_codes, tiled_scales;
  if (tiles_gate_up(host)) {
    tiled_codes = gate_up_tiled_rows(codes, n, code_row);
    codes = tiled_codes.data();
    if (nvfp4 || host.format == WeightFormat::kFp8PerChannel) {
      tiled_scales = gate_up_tiled_rows(scales, n, nvfp4 ? size_t(k / 16) : sizeof(float));
      scales = tiled_scales.data();
    }
    out.rows_reordered = true;
  }
  out.data =
      kernels::cuda::quant_gemm_pack_data(host.format, static_cast<const uint8_t*>(codes), n, k);
  switch (host.format) {
    case WeightFormat::kNvfp4:
      out.nvfp4_scales =
          kernels::cuda::quant_gemm_pack_nvfp4_scales(static_cast<const uint8_t*>(scales), n, k);
      break;
    case WeightFormat::kFp8Block:
      out.block_scales = kernels::cuda::quant_gemm_pack_block_scales(host.scales.as<float>(),
                                                                     size_t(host.scales.numel()));
      break;
    case WeightFormat::kFp8PerChannel: {
      const auto* f = static_cast<const float*>(scales);
      out.channel_scales.assign(f, f + n);
      break;
    }
    case WeightFormat::kFp8PerTensor:
      break;
  }
  return out;
}

kernels::cuda::QuantGemmWeight quant_gemm_weight(const QuantizedWeight& dev) {
  kernels::cuda::QuantGemmWeight w{};
  w.format = dev.format;
  w.n = dev.n;
  w.k = dev.k;
  w.data = static_cast<const uint8_t*>(dev.data.data);
  w.scales = dev.scales.data;
  w.global_scale = dev.global_scale.empty() ? 1.0f : dev.global_scale[0];
  w.block_n = dev.block_n;
  w.block_k = dev.block_k;
  return w;
}

}  // namespace serval::backend::cuda
