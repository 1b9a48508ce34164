// Dummy weight generation: one grid-stride pass over the output, a counter hash per element (or
// per 8-byte word); bound by stores (~30 integer instructions per element).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "kernels/cuda/gemm/quant_gemm.h"
#include "kernels/cuda/init/dummy_init.h"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/dummy_random.h"

namespace serval::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return unsigned(blocks < 65535 * 16 ? (blocks < 1 ? 1 : blocks) : 65535 * 16);
}

__global__ void dummy_dense_kernel(__nv_bfloat16* __restrict__ out, int64_t rows, int64_t cols,
                                   uint64_t key, int64_t offset, int64_t row_stride, float center,
                                   float half_width, bool via_f16) {
  pdl_wait();
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const float u = dummy_uniform(key, uint64_t(offset + r * row_stride + c));
    // Explicit roundings: the host computes center + (2u − 1)·half_width without contraction.
    float v = __fadd_rn(center, __fmul_rn(__fsub_rn(__fmul_rn(2.0f, u), 1.0f), half_width));
    if (via_f16) v = __half2float(__float2half_rn(v));
    out[i] = __float2bfloat16_rn(v);
  }
  pdl_launch_dependents();
}

__device__ __forceinline__ uint64_t fp8_byte(uint64_t key, uint64_t j, float half_width) {
  const float u = dummy_uniform(key, j);
  const float v = __fmul_rn(__fsub_rn(__fmul_rn(2.0f, u), 1.0f), half_width);
  return uint64_t(uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)));
}

// Bytes [8w, 8w + 8) of the stream as a little-endian word.
__device__ __forceinline__ uint64_t stream_word(uint64_t key, int64_t w, bool fp8,
                                                float half_width) {
  if (!fp8) return splitmix64(key + uint64_t(w));
  uint64_t word = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) word |= fp8_byte(key, uint64_t(8 * w + b), half_width) << (8 * b);
  return word;
}

// One 8-byte word per iteration; a partial last word is stored byte by byte.
__global__ void dummy_bytes_kernel(uint8_t* __restrict__ out, const uint8_t* __restrict__ mask,
                                   int64_t n, uint64_t key, bool fp8, float half_width) {
  pdl_wait();
  const int64_t words = (n + 7) / 8;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < words;
       w += int64_t(gridDim.x) * blockDim.x) {
    uint64_t word = stream_word(key, w, fp8, half_width);
    if (8 * w + 8 <= n) {
      if (mask) word &= reinterpret_cast<const uint64_t*>(mask)[w];
      reinterpret_cast<uint64_t*>(out)[w] = word;
    } else {
      for (int64_t j = 8 * w; j < n; ++j) {
        uint8_t byte = uint8_t(word >> (8 * (j - 8 * w)));
        if (mask) byte &= mask[j];
        out[j] = byte;
      }
    }
  }
  pdl_launch_dependents();
}

__global__ void dummy_codes_kernel(uint8_t* __restrict__ out, int64_t rows, int64_t cols,
                                   int64_t out_rows, int64_t out_cols, uint64_t key, uint8_t lo,
                                   uint8_t hi, bool gemm_tiles) {
  pdl_wait();
  const int64_t total = out_rows * out_cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / out_cols, c = i - r * out_cols;
    // The tiled layout is a permutation of the padded [out_rows, out_cols] bytes.
    const int64_t at = gemm_tiles ? quant_gemm_nvfp4_scale_offset(r, c, out_cols / 4) : i;
    out[at] = r < rows && c < cols ? dummy_code(dummy_uniform(key, uint64_t(r * cols + c)), lo, hi)
                                   : uint8_t(0);
  }
  pdl_launch_dependents();
}

bool aligned8(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 8 == 0;
}

}  // namespace

void dummy_dense(const DummyDenseParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0) return;
  if (p.source != DType::kF32 && p.source != DType::kBF16 && p.source != DType::kF16)
    throw Error("dummy_dense: values cannot be rounded to " + std::string(dtype_name(p.source)));
  launch_pdl("dummy_dense", dummy_dense_kernel, grid_for(p.rows * p.cols), kThreads, 0, stream,
             reinterpret_cast<__nv_bfloat16*>(p.out), p.rows, p.cols, p.key, p.offset, p.row_stride,
             p.center, p.half_width, p.source == DType::kF16);
}

void dummy_bytes(const DummyBytesParams& p, cudaStream_t stream) {
  if (p.n <= 0) return;
  if (!aligned8(p.out) || (p.mask && !aligned8(p.mask)))
    throw Error("dummy_bytes: output and mask must be 8-byte aligned");
  launch_pdl("dummy_bytes", dummy_bytes_kernel, grid_for((p.n + 7) / 8), kThreads, 0, stream, p.out,
             p.mask, p.n, p.key, p.fp8, p.half_width);
}

void dummy_codes(const DummyCodesParams& p, cudaStream_t stream) {
  if (p.out_rows <= 0 || p.out_cols <= 0) return;
  if (p.rows > p.out_rows || p.cols > p.out_cols || p.lo > p.hi ||
      (p.gemm_tiles && (p.out_rows % 32 != 0 || p.out_cols % 4 != 0)))
    throw Error(
        "dummy_codes: the logical shape must fit the padded one (tiles: 32 x 4) and lo <= hi");
  launch_pdl("dummy_codes", dummy_codes_kernel, grid_for(p.out_rows * p.out_cols), kThreads, 0,
             stream, p.out, p.rows, p.cols, p.out_rows, p.out_cols, p.key, p.lo, p.hi,
             p.gemm_tiles);
}

}  // namespace serval::kernels::cuda
