// One thread per 16-element block: one 8-byte code load, one scale byte, two 16-byte stores.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/quant/nvfp4_dequant.h"
#include "kernels/nvfp4_layout.h"

namespace serval::kernels::cuda {
namespace {

__global__ void __launch_bounds__(256) nvfp4_dequant_kernel(Nvfp4DequantParams p) {
  pdl_wait();
  const int64_t blocks_per_row = p.n / 16;
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= int64_t(p.m) * blocks_per_row) return;
  const float g = *p.global_scale;
  const uint2 codes = *reinterpret_cast<const uint2*>(p.q + b * 8);
  const __nv_fp8_e4m3 sf = *reinterpret_cast<const __nv_fp8_e4m3*>(p.sf + b);
  const float scale = float(sf);
  __align__(16) __nv_bfloat16 out[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint32_t word = i < 8 ? codes.x : codes.y;
    const uint32_t code = (word >> (4 * (i % 8))) & 0xFu;
    out[i] = __float2bfloat16_rn(e2m1_value(code) * scale / g);
  }
  uint4* dst = reinterpret_cast<uint4*>(reinterpret_cast<__nv_bfloat16*>(p.out) + b * 16);
  dst[0] = reinterpret_cast<const uint4*>(out)[0];
  dst[1] = reinterpret_cast<const uint4*>(out)[1];
}

}  // namespace

void nvfp4_dequant(const Nvfp4DequantParams& p, cudaStream_t stream) {
  if (p.n % 16 != 0 || p.m < 0)
    throw InvalidArgument("nvfp4_dequant: n (" + std::to_string(p.n) +
                          ") must be a multiple of 16");
  const int64_t blocks = int64_t(p.m) * (p.n / 16);
  if (blocks == 0) return;
  const unsigned grid = unsigned((blocks + 255) / 256);
  launch_pdl("nvfp4_dequant", nvfp4_dequant_kernel, dim3(grid), dim3(256), 0, stream, p);
}

}  // namespace serval::kernels::cuda
