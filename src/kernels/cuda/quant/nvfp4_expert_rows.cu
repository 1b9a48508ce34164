// One thread per 16-element block of a permuted row: the block's amax, its E4M3 scale factor and
// E2M1 codes, and their values, in the float operations of nvfp4_quant.cu and nvfp4_dequant.cu
// (explicitly rounded multiplies and divides, so nothing is contracted into an FMA).
#include "kernels/cuda/quant/nvfp4_expert_rows.h"

#include <cuda_bf16.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/nvfp4_layout.h"

namespace serval::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) expert_rows_kernel(Nvfp4ExpertRowsParams p) {
  pdl_wait();  // the maps and the source rows come from the kernels before
  pdl_launch_dependents();
  const int blocks_per_row = p.n / 16;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int r = int(i / blocks_per_row), b = int(i % blocks_per_row);
  if (r >= p.max_rows || r >= *p.num_tiles * p.tile) return;
  const int tok = p.permuted_to_token[r];
  if (p.gather && b == 0) p.rows_out[r] = tok >= 0 ? r : -1;
  if (tok < 0) return;
  const float g = p.global_scales[p.tile_expert[r / p.tile]];
  const int64_t src_row = p.gather ? tok : r;
  const uint4* src = reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(p.src) +
                                                    src_row * p.n + b * 16);
  const uint4 lo = src[0], hi = src[1];
  const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  float v[16];
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // bf16 → f32 is a shift: exact
    v[2 * j] = __uint_as_float(words[j] << 16);
    v[2 * j + 1] = __uint_as_float(words[j] & 0xFFFF0000u);
  }
  float amax = 0.0f;  // fmax from 0 ignores NaN, as the CPU twin does
#pragma unroll
  for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(v[j]));
  const uint8_t sf = e4m3_encode_rne_satfinite(__fdiv_rn(__fmul_rn(g, amax), 6.0f));
  const float sf_value = e4m3_decode(sf);
  const float scale = sf == 0 ? 0.0f : __fdiv_rn(g, sf_value);
  __align__(16) __nv_bfloat16 out[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    // sf == 0: every code 0 (+0), as nvfp4_quant stores for such a block.
    float q = 0.0f;
    if (sf != 0) {
      const uint32_t code =
          e2m1_magnitude_rne_satfinite(__fmul_rn(v[j], scale)) | (signbit(v[j]) ? 8u : 0u);
      q = e2m1_value(code);
    }
    out[j] = __float2bfloat16_rn(__fdiv_rn(__fmul_rn(q, sf_value), g));
  }
  uint4* dst =
      reinterpret_cast<uint4*>(reinterpret_cast<__nv_bfloat16*>(p.dst) + int64_t(r) * p.n + b * 16);
  dst[0] = reinterpret_cast<const uint4*>(out)[0];
  dst[1] = reinterpret_cast<const uint4*>(out)[1];
}

}  // namespace

void nvfp4_fake_quant_expert_rows(const Nvfp4ExpertRowsParams& p, cudaStream_t stream) {
  if (p.n <= 0 || p.n % 16 != 0 || p.max_rows < 0 || p.tile <= 0)
    throw InvalidArgument(
        "nvfp4_fake_quant_expert_rows: need n > 0 a multiple of 16 and tile > 0 "
        "(n " +
        std::to_string(p.n) + ", tile " + std::to_string(p.tile) + ")");
  if (!is_aligned16(p.src) || !is_aligned16(p.dst) || (p.gather && p.rows_out == nullptr))
    throw InvalidArgument(
        "nvfp4_fake_quant_expert_rows: src and dst must be 16-byte aligned, and "
        "gathering needs rows_out");
  const int64_t threads = int64_t(p.max_rows) * (p.n / 16);
  if (threads == 0) return;
  launch_pdl("nvfp4_fake_quant_expert_rows", expert_rows_kernel,
             dim3(unsigned((threads + kThreads - 1) / kThreads)), dim3(kThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
