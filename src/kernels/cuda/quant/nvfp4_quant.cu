// NVFP4 activation quantization kernel. Each thread quantizes 8 consecutive elements (one 16-byte
// load, one 32-bit store of 8 nibbles); the two threads of a 16-element block (adjacent lanes)
// share its amax through one shfl_xor, and the even one stores the SF byte. Threads walk rows
// with a grid stride (one resident wave), two rows per step, loading the next step's rows before
// quantizing the current ones. The grid covers the padded SF extent; lanes outside the real
// matrix only write zero SF bytes. Bit-exactness with the CPU twin: the same IEEE operations in
// the same order (__fmul_rn/__fdiv_rn, no FMA contraction, no approximate reciprocal, no FTZ), and
// the add-trick codecs of kernels/nvfp4_layout.h, which the CPU unit test checks against the plain
// reference codecs.
#include "kernels/cuda/quant/nvfp4_quant.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "base/error.h"
#include "base/math.h"
#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kElemsPerThread = 8;
// Rows each thread quantizes per loop step; their loads and the next step's are in flight together.
constexpr int kRowsInFlight = 2;
// 5 resident blocks of 256 (1280 threads, <= 48 registers each) keep ~40 KB of loads in flight
// per SM, enough for HBM's latency-bandwidth product.
constexpr int kMinBlocksPerSm = 5;

// Element 2j (low half) and 2j+1 (high half) of a 32-bit word as float; exact for both types.
template <bool kF16>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (kF16) {
    return make_float2(__half2float(__ushort_as_half(uint16_t(w & 0xFFFFu))),
                       __half2float(__ushort_as_half(uint16_t(w >> 16))));
  } else {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
  }
}

// SF byte position of (row, sf_col); sizes are checked to fit 32 bits on the host.
template <bool kSwizzled>
__device__ __forceinline__ uint32_t sf_offset(uint32_t row, uint32_t sf_col,
                                              uint32_t sf_cols_real) {
  if constexpr (kSwizzled) return nvfp4_sf_offset_128x4(row, sf_col, sf_cols_real);
  return row * sf_cols_real + sf_col;
}

// Quantizes one thread's 8 elements `cur` of row `row` (zeros where !valid) and stores them; on
// the padded grid (kPad) writes 0 to the SF byte of padding positions instead. Called by all 32
// lanes of a warp together (the shuffle pairs lanes 2i, 2i+1 = chunks 2i, 2i+1 of one row).
template <bool kF16, bool kPad, bool kSwizzled>
__device__ __forceinline__ void quantize_chunk(const uint4& cur, bool valid, int row, int chunk,
                                               int chunks, int chunks_pad, float g,
                                               uint32_t* __restrict__ q, uint8_t* __restrict__ sf) {
  const uint32_t w[4] = {cur.x, cur.y, cur.z, cur.w};
  float v[kElemsPerThread];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = unpack2<kF16>(w[j]);
    v[2 * j] = f.x;
    v[2 * j + 1] = f.y;
  }
  // Same order as the CPU reference: fmax from 0 (NaN ignored); max is exact and commutative.
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kElemsPerThread; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));

  // IEEE-rounded mul/div intrinsics: never contracted into FMA, never approximated.
  const uint8_t sf_byte = e4m3_encode_rne_satfinite(__fdiv_rn(__fmul_rn(g, amax), 6.0f));
  const float scale = sf_byte == 0 ? 0.0f : __fdiv_rn(g, e4m3_decode(sf_byte));
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < kElemsPerThread; ++i) {
    const uint32_t sign = (w[i / 2] >> ((i & 1) ? 31 : 15)) & 1u;  // input sign bit
    const uint32_t code = e2m1_magnitude_rne_satfinite(__fmul_rn(v[i], scale)) | (sign << 3);
    packed |= code << (4 * i);
  }
  if (sf_byte == 0) packed = 0;

  const bool even = (chunk & 1) == 0;
  const uint32_t sf_col = uint32_t(chunk) >> 1, sf_cols_real = uint32_t(chunks) >> 1;
  if (valid) {
    q[size_t(row) * chunks + chunk] = packed;
    if (even) sf[sf_offset<kSwizzled>(row, sf_col, sf_cols_real)] = sf_byte;
  } else if (kPad && even && chunk < chunks_pad) {
    sf[sf_offset<kSwizzled>(row, sf_col, sf_cols_real)] = 0;
  }
}

// x: [m, chunks] 16-byte chunks; q: [m, chunks] 32-bit words. Rows [0, rows_pad) and chunks
// [0, chunks_pad) form the padded grid (equal to m and chunks when !kPad). Each thread owns one
// chunk column and strides over rows, kRowsInFlight rows per step, loading the next step's rows
// before quantizing the current ones (2 x kRowsInFlight 16-byte loads in flight per thread).
template <bool kF16, bool kPad, bool kSwizzled>
__global__ void __launch_bounds__(kThreadsPerBlock, kMinBlocksPerSm)
    nvfp4_quant_kernel(const uint4* __restrict__ x, const float* __restrict__ global_scale,
                       uint32_t* __restrict__ q, uint8_t* __restrict__ sf, int m, int rows_pad,
                       int chunks, int chunks_pad) {
  const int chunk = blockIdx.x * blockDim.x + threadIdx.x;
  const bool col_real = chunk < chunks;
  const float g = __ldg(global_scale);
  const int row_step = gridDim.y * blockDim.y;
  // Every lane of a warp has the same threadIdx.y (blockDim.x is a multiple of 32), so the row
  // loop and the row bound checks below are warp-uniform and the shuffle sees all 32 lanes.
  int row = blockIdx.y * blockDim.y + threadIdx.y;

  auto load_rows = [&](int first_row, uint4(&buf)[kRowsInFlight]) {
#pragma unroll
    for (int d = 0; d < kRowsInFlight; ++d) {
      const int r = first_row + d * row_step;
      buf[d] = make_uint4(0, 0, 0, 0);
      if (col_real && r < m) buf[d] = __ldg(x + size_t(r) * chunks + chunk);
    }
  };
  uint4 next[kRowsInFlight];
  load_rows(row, next);
  for (; row < rows_pad; row += kRowsInFlight * row_step) {
    uint4 cur[kRowsInFlight];
#pragma unroll
    for (int d = 0; d < kRowsInFlight; ++d) cur[d] = next[d];
    load_rows(row + kRowsInFlight * row_step, next);
#pragma unroll
    for (int d = 0; d < kRowsInFlight; ++d) {
      const int r = row + d * row_step;
      if (r >= rows_pad) break;
      const bool valid = col_real && (!kPad || r < m);
      quantize_chunk<kF16, kPad, kSwizzled>(cur[d], valid, r, chunk, chunks, chunks_pad, g, q, sf);
    }
  }
}

template <bool kF16, bool kPad, bool kSwizzled>
void launch(const Nvfp4QuantParams& p, cudaStream_t stream) {
  const int chunks = p.n / kElemsPerThread;
  const int rows_pad = int(nvfp4_sf_rows(p.m, p.sf_layout));
  const int chunks_pad = kPad ? int(nvfp4_sf_cols(p.n, p.sf_layout)) * 2 : chunks;
  // Block: bx threads along a row (a multiple of 32, at most 256, balanced over the x blocks)
  // times by rows.
  const int blocks_x = ceil_div(chunks_pad, kThreadsPerBlock);
  const int bx = round_up(ceil_div(chunks_pad, blocks_x), 32);
  const int by = std::max(1, kThreadsPerBlock / bx);
  auto* kernel = nvfp4_quant_kernel<kF16, kPad, kSwizzled>;
  // One resident wave: each thread then strides over rows and keeps its next loads in flight.
  // The SM count and the occupancy per block size (multiples of 32) are queried once per
  // instantiation; the GPUs of one process are assumed alike.
  static std::atomic<int> sm_count{0};
  static std::atomic<int> resident[kThreadsPerBlock / 32 + 1];
  int sms = sm_count.load(std::memory_order_relaxed);
  if (sms == 0) {
    int device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    sm_count.store(sms, std::memory_order_relaxed);
  }
  int blocks_per_sm = resident[bx * by / 32].load(std::memory_order_relaxed);
  if (blocks_per_sm == 0) {
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, bx * by, 0);
    resident[bx * by / 32].store(blocks_per_sm, std::memory_order_relaxed);
  }
  const int wave_y = std::max(1, sms * std::max(1, blocks_per_sm) / blocks_x);
  const int blocks_y = std::min({ceil_div(rows_pad, by), wave_y, 65535});
  kernel<<<dim3(blocks_x, blocks_y), dim3(bx, by), 0, stream>>>(
      static_cast<const uint4*>(p.x), p.global_scale, reinterpret_cast<uint32_t*>(p.q), p.sf, p.m,
      rows_pad, chunks, chunks_pad);
  check_launch("nvfp4_quant");
}

template <bool kF16>
void dispatch_layout(const Nvfp4QuantParams& p, cudaStream_t stream) {
  if (p.sf_layout == Nvfp4SfLayout::kLinear) {
    launch<kF16, false, false>(p, stream);
  } else if (nvfp4_sf_has_padding(p.m, p.n, p.sf_layout)) {
    launch<kF16, true, true>(p, stream);
  } else {
    launch<kF16, false, true>(p, stream);
  }
}

void validate(const Nvfp4QuantParams& p) {
  const std::string where =
      "cuda nvfp4_quant (m=" + std::to_string(p.m) + ", n=" + std::to_string(p.n) + "): ";
  if (p.m < 0 || p.n <= 0 || p.n % kNvfp4BlockSize != 0)
    throw InvalidArgument(where + "need m >= 0 and n > 0 a multiple of 16");
  if (p.x_dtype != DType::kBF16 && p.x_dtype != DType::kF16)
    throw InvalidArgument(where + "x must be bfloat16 or float16, got " +
                          std::string(dtype_name(p.x_dtype)));
  if (!p.x || !p.global_scale || !p.q || !p.sf)
    throw InvalidArgument(where + "null pointer among x, global_scale, q, sf");
  if (!is_aligned16(p.x) || (reinterpret_cast<uintptr_t>(p.q) & 3u) != 0)
    throw InvalidArgument(where + "x must be 16-byte and q 4-byte aligned");
  if (nvfp4_sf_bytes(p.m, p.n, p.sf_layout) > int64_t{0xFFFFFFFF} ||
      nvfp4_sf_rows(p.m, p.sf_layout) > int64_t{0x7FFFFFFF})
    throw InvalidArgument(where + "too large: scale-factor offsets must fit 32 bits");
}

}  // namespace

void nvfp4_quant(const Nvfp4QuantParams& p, cudaStream_t stream) {
  validate(p);
  if (p.m == 0) return;
  if (p.x_dtype == DType::kF16) {
    dispatch_layout<true>(p, stream);
  } else {
    dispatch_layout<false>(p, stream);
  }
}

}  // namespace serval::kernels::cuda
