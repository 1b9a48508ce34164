// NVFP4 activation quantization kernel. The matrix is cut into tiles of 128 rows x 64 elements
// (one 128x4 scale-factor tile); in a tile, thread t of 256 owns the 8-element chunk t % 8 of rows
// t / 8 + 32·u, u = 0..3, so a warp reads 4 full 128-byte row segments per 16-byte load. The grid
// is persistent (at most 4 CTAs per SM, one pass over the tiles round-robin), and every CTA issues
// the loads of its next tile before quantizing the current one, so 64 bytes per thread stay in
// flight during the math and the per-CTA setup (the 256-entry g / float(sf) table, one IEEE
// division per thread) is paid once. The two threads of a 16-element block (adjacent lanes) share
// its amax through one shfl_xor; sf comes from the hardware E4M3 converter (two blocks per
// instruction); the 4 SF bytes of a row in a tile are gathered by two shuffles into one lane,
// which in the swizzled layout stores the 16 bytes of 4 rows (rows r, r+32, r+64, r+96 are
// consecutive there) with one store, padding zeros included; the linear layout stores 4-byte words
// when aligned. Per-element work: one multiply, the E2M1 code (e2m1_code: two min/max, one
// integer multiply-add, one fma, one mask) and the sign nibbles from byte permutes.
// Bit-exactness with the CPU twin: the same IEEE operations in the same order (__fmul_rn/__fdiv_rn,
// no FMA contraction, no approximate reciprocal, no FTZ), and codecs equal to those of
// kernels/nvfp4_layout.h (which the CPU unit test checks against the plain reference codecs).
#include "kernels/cuda/quant/nvfp4_quant.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
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

// 4 resident CTAs of 256 threads (<= 64 registers): 1024 threads per SM, each with the current
// tile's 64 bytes being quantized and the next tile's 64 bytes in flight.
constexpr int kMinBlocksPerSm = 4;

// E2M1 magnitude code (0..7) of v, equal to e2m1_magnitude_rne_satfinite (kernels/nvfp4_layout.h)
// for every float (checked exhaustively over all 2^32 inputs when written; NaN -> 7 through
// fminf). That codec adds M = 1.5·2^(e+22) (e = exponent of max(a, 1)) so that the single rounding
// of a + M is RNE onto the E2M1 grid, and reads k steps + 2(e − 127) from the sum's bits. Here M
// carries the 2(e − 127) in its own low mantissa bits (adding whole steps changes neither the
// binade nor the parity of the rounded step count, so the rounding is the same), which leaves the
// code alone in the low 4 bits: h = (e)·(2^23 + 2) + 2^22 − 254 = bits of
// 1.5·2^(e−127) + 2(e − 127) ulps, and one exact fma forms h·2^22 + a with a single rounding.
__device__ __forceinline__ uint32_t e2m1_code(float v) {
  const float a = fminf(fabsf(v), 6.0f);  // fminf(NaN, 6) = 6
  const float c = fmaxf(a, 1.0f);         // a is never NaN: same as the integer max of the codec
  const uint32_t h = (__float_as_uint(c) >> 23) * 0x800002u + (0x400000u - 254u);
  return __float_as_uint(__fmaf_rn(__uint_as_float(h), 4194304.0f, a)) & 0xFu;  // 2^22
}

// Sign bits of the 8 elements in `w` (element 2j in the low, 2j+1 in the high half of w[j]) at
// the nibble sign positions 4i + 3: byte j of the result takes bit 15 of w[j] to bit 3 and bit 31
// to bit 7. Four byte permutes gather the high bytes of every half.
__device__ __forceinline__ uint32_t sign_nibbles(const uint32_t (&w)[4]) {
  const uint32_t p01 = __byte_perm(w[0], w[1], 0x5173);  // w0.b3, w1.b3, w0.b1, w1.b1
  const uint32_t p23 = __byte_perm(w[2], w[3], 0x5173);
  const uint32_t odd = __byte_perm(p01, p23, 0x5410);   // w0.b3 w1.b3 w2.b3 w3.b3
  const uint32_t even = __byte_perm(p01, p23, 0x7632);  // w0.b1 w1.b1 w2.b1 w3.b1
  return (odd & 0x80808080u) | ((even >> 4) & 0x08080808u);
}

// One 128x64 tile: thread t owns chunk t % 8 (8 elements) of rows t / 8 + 32·u, u = 0..3.
struct TileCoord {
  int chunk, row0;  // this thread's chunk (in 8-element units) and first row
  int bx, by;       // SF column tile and row tile
};

__device__ __forceinline__ TileCoord tile_coord(int tile, int k_tiles) {
  const int t = threadIdx.x, by = tile / k_tiles, bx = tile - by * k_tiles;
  return {bx * kTileChunks + t % kTileChunks, by * kTileRows + t / kTileChunks, bx, by};
}

template <bool kCheck>
__device__ __forceinline__ void load_tile(const uint4* __restrict__ x, const TileCoord& c, int m,
                                          int chunks, uint4 (&in)[kRowsPerThread]) {
#pragma unroll
  for (int u = 0; u < kRowsPerThread; ++u) {
    const int r = c.row0 + u * kRowsPerPass;
    in[u] = make_uint4(0, 0, 0, 0);
    if (!kCheck || (c.chunk < chunks && r < m)) in[u] = __ldg(x + size_t(r) * chunks + c.chunk);
  }
}

// Quantizes the thread's 4 chunks `in` of tile `c` and stores codes and SF bytes. Called by all
// threads of the CTA together (warp shuffles). Per chunk: the same float operations as the CPU
// twin (amax over the block through one shfl_xor with the partner lane, sf = e4m3((g·amax)/6)
// by the hardware RNE/satfinite converter, which for these inputs (>= 0, maybe +inf) equals
// e4m3_encode_rne_satfinite, scale from the table, codes of v·scale).
template <bool kF16, bool kCheck, bool kSwizzled>
__device__ __forceinline__ void quantize_tile(const uint4 (&in)[kRowsPerThread], const TileCoord& c,
                                              float g, const float* __restrict__ scale_of,
                                              uint32_t* __restrict__ q, uint8_t* __restrict__ sf,
                                              int m, int chunks, int sf_cols, int k_tiles,
                                              bool sf_words) {
  // Two rows at a time (amax, one converter instruction for both SF bytes, codes), so that at most
  // 16 unpacked values are live next to the prefetched tile.
  const bool col_real = !kCheck || c.chunk < chunks;
  uint32_t sf_byte[kRowsPerThread];
#pragma unroll
  for (int u0 = 0; u0 < kRowsPerThread; u0 += 2) {
    float amax[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4& v = in[u0 + h];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      float a = 0.0f;  // fmax from 0, NaN ignored: exact and order-free, as on the CPU
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = unpack2<kF16>(w[j]);
        a = fmaxf(a, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
      amax[h] = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
    }
    // IEEE-rounded mul/div intrinsics: never contracted into FMA, never approximated.
    const float2 s =
        make_float2(__fdiv_rn(__fmul_rn(g, amax[0]), 6.0f), __fdiv_rn(__fmul_rn(g, amax[1]), 6.0f));
    const uint32_t pair = __nv_cvt_float2_to_fp8x2(s, __NV_SATFINITE, __NV_E4M3);  // s.x low
    sf_byte[u0] = pair & 0xFFu;
    sf_byte[u0 + 1] = (pair >> 8) & 0xFFu;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int u = u0 + h;
      const uint32_t w[4] = {in[u].x, in[u].y, in[u].z, in[u].w};
      const float scale = scale_of[sf_byte[u]];
      uint32_t packed = sign_nibbles(w);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = unpack2<kF16>(w[j]);
        packed |= e2m1_code(__fmul_rn(f.x, scale)) << (8 * j);
        packed |= e2m1_code(__fmul_rn(f.y, scale)) << (8 * j + 4);
      }
      const int r = c.row0 + u * kRowsPerPass;
      if (!kCheck || (col_real && r < m)) {
        q[size_t(r) * chunks + c.chunk] = sf_byte[u] == 0 ? 0u : packed;
      }
    }
  }

  // SF bytes: lane 8i + 2k holds SF column k (of this tile) of rows row0 + 32u. Gather each row's
  // 4 bytes (columns 0..3, little-endian) into lane 8i: two u at a time, 16 bits each.
  uint32_t word[kRowsPerThread];
#pragma unroll
  for (int u = 0; u < kRowsPerThread; u += 2) {
    uint32_t x = sf_byte[u] | (sf_byte[u + 1] << 16);
    x |= __shfl_xor_sync(0xFFFFFFFFu, x, 2) << 8;  // lanes 8i, 8i+4: columns 0,1 / 2,3
    const uint32_t y = __shfl_xor_sync(0xFFFFFFFFu, x, 4);
    word[u] = __byte_perm(x, y, 0x5410);
    word[u + 1] = __byte_perm(x, y, 0x7632);
  }
  if (threadIdx.x % kTileChunks != 0) return;
  if constexpr (kSwizzled) {
    // Tile (by, bx) holds (row % 32)·16 + ((row % 128) / 32)·4 + column: the 4 rows row0 + 32u
    // are 16 consecutive bytes. Edge tiles store zeros for rows >= m and columns >= n/16 (their
    // inputs were loaded as zeros, which give sf 0), which is the required padding.
    const size_t tile = (size_t(c.by) * k_tiles + c.bx) * kSfTileBytes;
    const int r0 = threadIdx.x / kTileChunks;
    reinterpret_cast<uint4*>(sf + tile)[r0] = make_uint4(word[0], word[1], word[2], word[3]);
  } else {
    const int col = 4 * c.bx;
    if (sf_words) {  // sf_cols % 4 == 0 and sf 4-byte aligned: the 4 columns are all real
#pragma unroll
      for (int u = 0; u < kRowsPerThread; ++u) {
        const int r = c.row0 + u * kRowsPerPass;
        if (!kCheck || r < m) {
          *reinterpret_cast<uint32_t*>(sf + size_t(r) * sf_cols + col) = word[u];
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < kRowsPerThread; ++u) {
        const int r = c.row0 + u * kRowsPerPass;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if ((!kCheck || r < m) && col + k < sf_cols) {
            sf[size_t(r) * sf_cols + col + k] = uint8_t(word[u] >> (8 * k));
          }
        }
      }
    }
  }
}

// x: [m, chunks] 16-byte chunks; q: [m, chunks] 32-bit words. The tiles (row tile by, SF column
// tile bx), numbered by * k_tiles + bx, are dealt to the CTAs round-robin; each CTA loads its next
// tile before quantizing the current one. kCheck: tiles may reach past the real matrix (rows >= m
// or chunks >= chunks); there the swizzled layout gets zero SF bytes and the linear layout
// nothing. sf_cols: real SF columns (n/16); k_tiles: SF column tiles of 4; sf_words: the linear
// layout may store SF bytes 4 at a time.
template <bool kF16, bool kCheck, bool kSwizzled>
__global__ void __launch_bounds__(kThreadsPerBlock, kMinBlocksPerSm)
    nvfp4_quant_kernel(const uint4* __restrict__ x, const float* __restrict__ global_scale,
                       uint32_t* __restrict__ q, uint8_t* __restrict__ sf, int m, int chunks,
                       int sf_cols, int k_tiles, int tiles, bool sf_words) {
  __shared__ float scale_of[256];
  pdl_wait();  // x and the global scale may come from the previous kernel

  int tile = blockIdx.x;  // the grid has at most `tiles` CTAs
  TileCoord c = tile_coord(tile, k_tiles);
  uint4 cur[kRowsPerThread];
  load_tile<kCheck>(x, c, m, chunks, cur);
  pdl_launch_dependents();  // the consumer (a GEMM) may start streaming its weights
  const float g = __ldg(global_scale);
  {
    const uint8_t b = uint8_t(threadIdx.x);  // 256 threads: one table entry each
    scale_of[threadIdx.x] = b == 0 ? 0.0f : __fdiv_rn(g, e4m3_decode(b));
  }
  __syncthreads();

  for (;;) {
    const int next = tile + int(gridDim.x);
    const TileCoord nc = tile_coord(next, k_tiles);
    uint4 nxt[kRowsPerThread];
    if (next < tiles) {
      load_tile<kCheck>(x, nc, m, chunks, nxt);
    } else {
#pragma unroll
      for (int u = 0; u < kRowsPerThread; ++u) nxt[u] = make_uint4(0, 0, 0, 0);
    }
    quantize_tile<kF16, kCheck, kSwizzled>(cur, c, g, scale_of, q, sf, m, chunks, sf_cols, k_tiles,
                                           sf_words);
    if (next >= tiles) break;
    tile = next;
    c = nc;
#pragma unroll
    for (int u = 0; u < kRowsPerThread; ++u) cur[u] = nxt[u];
  }
}

template <bool kF16, bool kCheck, bool kSwizzled>
void launch(const Nvfp4QuantParams& p, cudaStream_t stream) {
  const int chunks = p.n / kElemsPerThread, sf_cols = p.n / kNvfp4BlockSize;
  // Swizzled: the tiles cover the padded SF extent (round_up(m, 128) rows, round_up(n/16, 4) SF
  // columns = k_tiles tiles of 8 chunks); linear: the real matrix, rounded up to whole tiles.
  const int k_tiles = ceil_div(sf_cols, 4);
  const int tiles = k_tiles * ceil_div(p.m, kTileRows);
  const int grid = std::min(tiles, sm_count() * kMinBlocksPerSm);
  const bool sf_words = sf_cols % 4 == 0 && (reinterpret_cast<uintptr_t>(p.sf) & 3u) == 0;
  launch_pdl("nvfp4_quant", nvfp4_quant_kernel<kF16, kCheck, kSwizzled>, dim3(unsigned(grid)),
             dim3(kThreadsPerBlock), 0, stream, static_cast<const uint4*>(p.x), p.global_scale,
             reinterpret_cast<uint32_t*>(p.q), p.sf, p.m, chunks, sf_cols, k_tiles, tiles,
             sf_words);
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
