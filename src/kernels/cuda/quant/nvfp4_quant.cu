// NVFP4 activation quantization kernel. One CTA of 256 threads quantizes a tile of 128 rows x 64
// elements (one 128x4 scale-factor tile): thread t owns the 8-element chunk t % 8 of rows
// t / 8 + 32·u, u = 0..3, so a warp reads 4 full 128-byte row segments per load. All four
// 16-byte loads are issued before any math, and the grid covers the whole (padded) matrix in one
// launch, so many loads stay in flight per SM. The two threads of a 16-element block (adjacent
// lanes) share its amax through one shfl_xor; the even one writes the SF byte. In the swizzled
// layout the 512 SF bytes of the tile (real ones and padding zeros alike) are staged in shared
// memory and stored as 32 coalesced 16-byte words; the linear layout stores bytes directly.
// g / float(sf) takes one of 256 values: each CTA builds that table once (one division per
// thread) instead of dividing per block.
// Bit-exactness with the CPU twin: the same IEEE operations in the same order (__fmul_rn/__fdiv_rn,
// no FMA contraction, no approximate reciprocal, no FTZ), and the add-trick codecs of
// kernels/nvfp4_layout.h, which the CPU unit test checks against the plain reference codecs. The
// E2M1 code is that codec rewritten with the same single rounding (e2m1_term: an exact fma, the
// constant folded per packed word, signs copied from the inputs per word; checked equal to
// e2m1_magnitude_rne_satfinite for all 2^32 float inputs when written).
#include "kernels/cuda/quant/nvfp4_quant.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "base/math.h"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kElemsPerThread = 8;
constexpr int kTileRows = 128;                                // rows per CTA
constexpr int kTileChunks = 8;                                // 8-element chunks per row
constexpr int kRowsPerPass = kThreadsPerBlock / kTileChunks;  // 32
constexpr int kRowsPerThread = kTileRows / kRowsPerPass;      // 4 loads in flight
constexpr int kSfTileBytes = kTileRows * kTileChunks / 2;     // 512
static_assert(kRowsPerPass == 32 && kSfTileBytes == 512, "one 128x4 SF tile per CTA");
// 5 resident CTAs (1280 threads, <= 51 registers each): 80 KB of loads in flight per SM, and
// enough warps to overlap one CTA's quantization math with the others' loads. The bounds-checked
// variants (edge tiles, small m) keep 4 so that they do not spill.
template <bool kCheck>
constexpr int kMinBlocksPerSm = kCheck ? 4 : 5;

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

// e2m1_magnitude_rne_satfinite(v) + 299 (kernels/nvfp4_layout.h): the code without its
// constant, so that callers fold the constant into one subtraction per packed word. The same
// single rounding of a + m, with m = 1.5·2^(e−127+22) written as h·2^22 (h = 1.5·2^(e−127), an
// exact product) so one fma replaces the exponent add and the float add.
__device__ __forceinline__ uint32_t e2m1_term(float v) {
  const float a = fminf(fabsf(v), 6.0f);  // fminf(NaN, 6) = 6
  const uint32_t b = max(__float_as_uint(a), 0x3F800000u);
  const float h = __uint_as_float((b & 0xFF800000u) | 0x400000u);
  const uint32_t s = __float_as_uint(__fmaf_rn(h, 4194304.0f, a));  // 4194304 = 2^22
  return (s & 0xFu) + (s >> 22);
}

// Quantizes one thread's 8 elements `cur` (zeros for positions outside the matrix): returns the
// 8 packed nibbles and sets `sf_byte`. Called by all 32 lanes together (the shuffle pairs lanes
// 2i, 2i+1 = the two halves of one 16-element block). `scale_of` maps an SF byte to
// g / float(sf) (0 for sf 0).
template <bool kF16>
__device__ __forceinline__ uint32_t quantize8(const uint4& cur, float g,
                                              const float* __restrict__ scale_of,
                                              uint32_t& sf_out) {
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
  const uint32_t sf_byte = e4m3_encode_rne_satfinite(__fdiv_rn(__fmul_rn(g, amax), 6.0f));
  const float scale = scale_of[sf_byte];
  // Magnitude codes, summed in place: code_i = t_i − 299 with t_i as in e2m1_term, so the packed
  // word Σ code_i·16^i is Σ t_i·16^i − 299·0x11111111 (exact in 32-bit modular arithmetic).
  uint32_t packed = 0u - 299u * 0x11111111u;
#pragma unroll
  for (int i = 0; i < kElemsPerThread; ++i) {
    packed += e2m1_term(__fmul_rn(v[i], scale)) << (4 * i);
  }
  // Sign (bit 3 of each nibble) straight from the input sign bits: bit 15 of word j is element
  // 2j's (to bit 8j + 3), bit 31 element 2j+1's (to bit 8j + 7).
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    packed |= (((w[j] >> 12) & 0x8u) | ((w[j] >> 24) & 0x80u)) << (8 * j);
  }
  sf_out = sf_byte;
  return sf_byte == 0 ? 0u : packed;
}

// x: [m, chunks] 16-byte chunks; q: [m, chunks] 32-bit words. CTA (bx, by) owns rows
// [128·by, 128·by + 128) and chunks [8·bx, 8·bx + 8). kCheck: the tile may reach past the real
// matrix (rows >= m or chunks >= chunks); there the swizzled layout gets zero SF bytes and the
// linear layout nothing. sf_cols: real SF columns (n/16); k_tiles: SF column tiles of 4.
template <bool kF16, bool kCheck, bool kSwizzled>
__global__ void __launch_bounds__(kThreadsPerBlock, kMinBlocksPerSm<kCheck>)
    nvfp4_quant_kernel(const uint4* __restrict__ x, const float* __restrict__ global_scale,
                       uint32_t* __restrict__ q, uint8_t* __restrict__ sf, int m, int chunks,
                       int sf_cols, int k_tiles) {
  __shared__ float scale_of[256];
  __shared__ __align__(16) uint8_t sf_tile[kSwizzled ? kSfTileBytes : 16];
  pdl_wait();  // x and the global scale may come from the previous kernel

  const int t = threadIdx.x;
  const int cc = t % kTileChunks, r0 = t / kTileChunks;  // chunk in tile, first row in tile
  const int chunk = blockIdx.x * kTileChunks + cc;
  const int row0 = blockIdx.y * kTileRows + r0;
  const bool col_real = !kCheck || chunk < chunks;

  uint4 in[kRowsPerThread];
#pragma unroll
  for (int u = 0; u < kRowsPerThread; ++u) {
    const int r = row0 + u * kRowsPerPass;
    in[u] = make_uint4(0, 0, 0, 0);
    if (!kCheck || (col_real && r < m)) in[u] = __ldg(x + size_t(r) * chunks + chunk);
  }
  pdl_launch_dependents();  // the consumer (a GEMM) may start streaming its weights
  const float g = __ldg(global_scale);
  {
    const uint8_t b = uint8_t(t);  // 256 threads: one table entry each
    scale_of[t] = b == 0 ? 0.0f : __fdiv_rn(g, e4m3_decode(b));
  }
  __syncthreads();

  const int sf_col = chunk >> 1;
#pragma unroll
  for (int u = 0; u < kRowsPerThread; ++u) {
    const int r = row0 + u * kRowsPerPass;
    uint32_t sf_byte;
    const uint32_t packed = quantize8<kF16>(in[u], g, scale_of, sf_byte);
    const bool valid = !kCheck || (col_real && r < m);
    if (valid) q[size_t(r) * chunks + chunk] = packed;
    if ((cc & 1) == 0) {
      if constexpr (kSwizzled) {
        // (row % 32)·16 + ((row % 128) / 32)·4 + sf_col % 4 within the tile; r0 < 32.
        sf_tile[r0 * 16 + u * 4 + (cc >> 1)] = valid ? uint8_t(sf_byte) : uint8_t(0);
      } else if (valid) {
        sf[size_t(r) * sf_cols + sf_col] = uint8_t(sf_byte);
      }
    }
  }
  if constexpr (kSwizzled) {
    __syncthreads();
    if (t < kSfTileBytes / 16) {
      const size_t tile = (size_t(blockIdx.y) * k_tiles + blockIdx.x) * kSfTileBytes;
      reinterpret_cast<uint4*>(sf + tile)[t] = reinterpret_cast<const uint4*>(sf_tile)[t];
    }
  }
}

template <bool kF16, bool kCheck, bool kSwizzled>
void launch(const Nvfp4QuantParams& p, cudaStream_t stream) {
  const int chunks = p.n / kElemsPerThread, sf_cols = p.n / kNvfp4BlockSize;
  // Swizzled: the grid covers the padded SF extent (round_up(m, 128) rows, round_up(n/16, 4) SF
  // columns = k_tiles tiles of 8 chunks); linear: the real matrix, rounded up to whole tiles.
  const int k_tiles = ceil_div(sf_cols, 4);
  const int row_tiles = ceil_div(p.m, kTileRows);
  launch_pdl("nvfp4_quant", nvfp4_quant_kernel<kF16, kCheck, kSwizzled>,
             dim3(unsigned(k_tiles), unsigned(row_tiles)), dim3(kThreadsPerBlock), 0, stream,
             static_cast<const uint4*>(p.x), p.global_scale, reinterpret_cast<uint32_t*>(p.q), p.sf,
             p.m, chunks, sf_cols, k_tiles);
}

template <bool kF16>
void dispatch_layout(const Nvfp4QuantParams& p, cudaStream_t stream) {
  // Whole tiles (m % 128 == 0, n % 64 == 0): no bounds checks and, swizzled, no padding bytes.
  const bool whole = p.m % kTileRows == 0 && p.n % (kTileChunks * kElemsPerThread) == 0;
  if (p.sf_layout == Nvfp4SfLayout::kLinear) {
    if (whole) return launch<kF16, false, false>(p, stream);
    return launch<kF16, true, false>(p, stream);
  }
  if (whole) return launch<kF16, false, true>(p, stream);
  launch<kF16, true, true>(p, stream);
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
  if (p.sf_layout == Nvfp4SfLayout::kSwizzled128x4 && !is_aligned16(p.sf))
    throw InvalidArgument(where + "the swizzled scale-factor buffer must be 16-byte aligned");
  if (nvfp4_sf_bytes(p.m, p.n, p.sf_layout) > int64_t{0xFFFFFFFF} ||
      ceil_div(int64_t(p.m), int64_t{kTileRows}) > 65535)
    throw InvalidArgument(where + "too large: scale-factor offsets must fit 32 bits and m 2^23");
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
