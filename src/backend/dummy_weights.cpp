// The host fallback of Backend::dummy_dense / dummy_quantized: the values in host memory, then
// the ordinary upload (a view on the CPU backend).
#include <fmt/format.h>

#include "backend/backend.h"
#include "base/math.h"
#include "kernels/cpu/dummy_init.h"

namespace serval::backend {

namespace {

// Checks that `d`'s blocks cover its tensor; returns the tensor's rows.
int64_t dummy_rows(const DummyDense& d) {
  int64_t numel = 1;
  for (int64_t s : d.shape) numel *= s;
  int64_t rows = 0;
  for (const DummyBlock& b : d.blocks) rows += b.rows;
  if (d.cols <= 0 || numel % d.cols != 0 || rows * d.cols != numel)
    throw InvalidArgument(fmt::format(
        "dummy_dense: blocks of {} rows × {} columns do not cover a tensor of {} elements", rows,
        d.cols, numel));
  return rows;
}

Shape with_experts(int experts, Shape shape) {
  if (experts > 0) shape.insert(shape.begin(), int64_t(experts));
  return shape;
}

}  // namespace

Tensor Backend::dummy_dense(const DummyDense& d) {
  dummy_rows(d);
  Tensor host = host_empty(d.dtype, d.shape);
  const size_t row_bytes = size_t(d.cols) * dtype_bits(d.dtype) / 8;
  int64_t row = 0;
  for (const DummyBlock& b : d.blocks) {
    kernels::cpu::dummy_dense(static_cast<char*>(host.data) + size_t(row) * row_bytes, d.dtype,
                              b.rows, d.cols, b.key, b.offset, b.row_stride, b.center,
                              b.half_width);
    row += b.rows;
  }
  return upload_weight(host);
}

QuantizedWeight Backend::dummy_quantized(const DummyQuantized& d) {
  using kernels::WeightFormat;
  QuantizedWeight q = d.meta;
  const int64_t n = q.n, k = q.k;
  const int64_t experts = q.experts > 0 ? q.experts : 1;
  switch (q.format) {
    case WeightFormat::kNvfp4:
      if (k % 16 != 0) throw InvalidArgument(fmt::format("dummy_quantized: NVFP4 k {} % 16", k));
      q.data = host_empty(DType::kU8, with_experts(q.experts, {n, k / 2}));
      kernels::cpu::dummy_bits(q.data.as<uint8_t>(), int64_t(q.data.nbytes()), d.data_key);
      q.scales = host_empty(DType::kF8E4M3, with_experts(q.experts, {n, k / 16}));
      kernels::cpu::dummy_codes(static_cast<uint8_t*>(q.scales.data), q.scales.numel(), d.scale_key,
                                d.sf_code_lo, d.sf_code_hi);
      break;
    case WeightFormat::kFp8PerTensor:
    case WeightFormat::kFp8PerChannel:
    case WeightFormat::kFp8Block: {
      q.data = host_empty(DType::kF8E4M3, with_experts(q.experts, {n, k}));
      kernels::cpu::dummy_fp8(static_cast<uint8_t*>(q.data.data), q.data.numel(), d.data_key,
                              d.fp8_half_width);
      if (q.format == WeightFormat::kFp8PerChannel) {
        q.scales = host_empty(DType::kF32, with_experts(q.experts, {n}));
      } else if (q.format == WeightFormat::kFp8Block) {
        if (q.block_n <= 0 || q.block_k <= 0)
          throw InvalidArgument("dummy_quantized: FP8 block weight without a block size");
        q.scales =
            host_empty(DType::kF32, with_experts(q.experts, {ceil_div<int64_t>(n, q.block_n),
                                                             ceil_div<int64_t>(k, q.block_k)}));
      }
      if (q.scales.data)
        for (int64_t i = 0; i < q.scales.numel(); ++i) q.scales.as<float>()[i] = d.fp8_scale;
      break;
    }
  }
  if (q.global_scale.size() != size_t(experts) || q.input_scale.size() != size_t(experts))
    throw InvalidArgument(
        fmt::format("dummy_quantized: {} global and {} input scales for {} expert(s)",
                    q.global_scale.size(), q.input_scale.size(), experts));
  return upload_quantized(q);
}

}  // namespace serval::backend
