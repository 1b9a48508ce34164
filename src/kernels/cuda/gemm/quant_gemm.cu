// Weight-only NVFP4 / FP8 GEMMs on mma.sync m16n8k16 (bf16 → fp32), swap-AB: weight rows are the
// MMA M side, tokens the N side. Each warp streams one 32-row tile of the weight (fragment layout,
// see quant_gemm.h) over a K range with 16-byte L1-bypassing loads, dequantizes in registers with
// integer bit operations and one bf16x2 multiply per register, and reads activations straight
// from L1/L2 (they are tiny and shared by every warp). Split-K over grid.y writes fp32 partials
// that a second kernel sums in a fixed order (deterministic).
#include "kernels/cuda/gemm/quant_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kWarps = 4;                   // warps (row tiles) per CTA
constexpr uint32_t kFp8Mult = 0x7B807B80u;  // bf16x2 {2^120, 2^120}
constexpr uint32_t kNegZero2 = 0x80008000u;

struct DeviceArgs {
  QuantGemmParams p;
  float alpha;             // NVFP4: global_scale·2^7; FP8 per-tensor: global_scale; else 1
  const float* row_scale;  // FP8 per-channel [n], else null
  const uint16_t* block;   // FP8 block multipliers (bf16 bits), else null
  int block_cols;          // ceil(k / block_k)
  int k_blocks;            // k_pad / 64
  int n_tiles;             // n_pad / 32
  int splits;
};

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// bf16x2 product (round to nearest even; subnormal inputs are honoured by bf16 arithmetic).
__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(kNegZero2));
  return d;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bf16x2 {v, v} with v = e4m3(byte) · 2^119 (exact). Normal e4m3 (exponent e ≥ 1): bf16 exponent
// e + 239, mantissa mmm; subnormal (m/8 · 2^-6): m · 2^110; zero → 0.
__device__ __forceinline__ uint32_t nvfp4_mult(uint32_t byte) {
  const uint32_t mag = byte & 0x7Fu;
  uint32_t h;
  if (mag & 0x78u) {
    h = (mag << 4) + (239u << 7);
  } else {
    h = __float_as_uint(float(mag) * 0x1p110f) >> 16;  // ≤ 3 significant bits: exact
  }
  return h | (h << 16);
}

// The four A registers of k16 step s for one 16-row group, dequantized and multiplied:
// NVFP4 values become e2m1·sf·2^-7, FP8 values e4m3·(block scale or 1).
// `words`: the lane's 4 (NVFP4) or 8 (FP8) words; m_lo / m_hi: multipliers of rows g / g+8.
template <bool kFp4>
__device__ __forceinline__ void decode_step(const uint32_t* words, int s, uint32_t m_lo,
                                            uint32_t m_hi, uint32_t (&a)[4]) {
  if constexpr (kFp4) {
    const uint32_t q = words[s];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t t = q << (4 * i);  // nibbles 3−i and 7−i now at 3 and 7
      // e2m1 (s e1 e0 m) → bf16 sign, exponent low bits e1e0, mantissa msb m: value e2m1·2^-126
      const uint32_t v = (t & 0x80008000u) | ((t & 0x70007000u) >> 6);
      a[i] = bmul2(v, (i & 1) ? m_hi : m_lo);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t q = words[2 * s + j];
      const uint32_t q2 = q << 8;
      // e4m3 in the high byte of each half → bf16 sign, exponent low 4 bits, mantissa top 3
      // bits: value e4m3·2^-120 (subnormals included); the multiplier carries the 2^120.
      const uint32_t v0 = (q & 0x80008000u) | ((q & 0x7F007F00u) >> 4);
      const uint32_t v1 = (q2 & 0x80008000u) | ((q2 & 0x7F007F00u) >> 4);
      a[2 * j] = bmul2(v0, m_lo);
      a[2 * j + 1] = bmul2(v1, m_hi);
    }
  }
}

// FP8 multiplier of rows (row, row+8) at column col: block table entry or the constant 2^120.
__device__ __forceinline__ void fp8_mults(const DeviceArgs& d, int row, int col, uint32_t& m_lo,
                                          uint32_t& m_hi) {
  if (d.block == nullptr) {
    m_lo = m_hi = kFp8Mult;
    return;
  }
  const QuantGemmWeight& w = d.p.w;
  const int c = min(col, w.k - 1) / w.block_k;  // padded rows/columns: any valid entry (codes 0)
  const int r0 = min(row, w.n - 1) / w.block_n, r1 = min(row + 8, w.n - 1) / w.block_n;
  const uint32_t h0 = __ldg(d.block + size_t(r0) * d.block_cols + c);
  const uint32_t h1 = __ldg(d.block + size_t(r1) * d.block_cols + c);
  m_lo = h0 | (h0 << 16);
  m_hi = h1 | (h1 << 16);
}

// Final value of output (tok, row) from its fp32 sum.
__device__ __forceinline__ void store_out(const DeviceArgs& d, int tok, int row, float v) {
  const QuantGemmParams& p = d.p;
  v *= d.alpha;
  if (d.row_scale) v *= d.row_scale[row];
  if (p.bias) v += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[row]);
  const size_t i = size_t(tok) * p.w.n + row;
  if (p.y_f32) {
    static_cast<float*>(p.y)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(p.y)[i] = __float2bfloat16_rn(v);
  }
}

// Lane bytes of (row tile rt, k block kb, group h).
template <bool kFp4>
__device__ __forceinline__ const uint8_t* lane_ptr(const uint8_t* data, int k_blocks, int rt,
                                                   int kb, int h, int lane) {
  constexpr int kB = kFp4 ? 16 : 32;
  return data + ((size_t(rt * k_blocks + kb) * 2 + h) * 32 + lane) * kB;
}

// One k block's raw bytes of both groups of a lane (and the NVFP4 scale words of rows g, g+8).
template <bool kFp4>
struct Raw {
  static constexpr int kWords = kFp4 ? 4 : 8;
  uint32_t w[2][kWords];
  uint32_t sf[2][2];
};

template <bool kFp4>
__device__ __forceinline__ void load_raw(const DeviceArgs& d, int rt, int kb, int lane,
                                         Raw<kFp4>& r) {
  const QuantGemmWeight& w = d.p.w;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* src = lane_ptr<kFp4>(w.data, d.k_blocks, rt, kb, h, lane);
#pragma unroll
    for (int c = 0; c < Raw<kFp4>::kWords / 4; ++c) {
      const uint4 v = ld_stream(src + 16 * c);
      r.w[h][4 * c] = v.x;
      r.w[h][4 * c + 1] = v.y;
      r.w[h][4 * c + 2] = v.z;
      r.w[h][4 * c + 3] = v.w;
    }
    if constexpr (kFp4) {
      const int row = rt * 32 + h * 16 + (lane >> 2);
      const uint32_t* sf = static_cast<const uint32_t*>(w.scales);
      const size_t stride = size_t(d.k_blocks);  // u32 words per row: k_pad / 64
      r.sf[h][0] = __ldg(sf + size_t(row) * stride + kb);
      r.sf[h][1] = __ldg(sf + size_t(row + 8) * stride + kb);
    }
  }
}

// Grid (ceil(n_tiles / kWarps), splits, ceil(m / (8·NI))); warp = one 32-row tile × 8·NI tokens.
template <bool kFp4, int NI>
__global__ void __launch_bounds__(kWarps * 32) quant_gemm_kernel(DeviceArgs d) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rt = blockIdx.x * kWarps + warp;
  if (rt >= d.n_tiles) return;  // no barriers in this kernel
  const QuantGemmParams& p = d.p;
  const int split = blockIdx.y;
  const int kb0 = int(int64_t(split) * d.k_blocks / d.splits);
  const int kb1 = int(int64_t(split + 1) * d.k_blocks / d.splits);
  const int tok0 = blockIdx.z * 8 * NI;
  const int g = lane >> 2, t = lane & 3;
  const int k = p.w.k;

  // B fragments: token g of each n8 block (clamped to a valid row: columns of the MMA are
  // independent, and results of tokens ≥ m are never stored).
  const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  const __nv_bfloat16* xrow[NI];
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) xrow[ni] = x + size_t(min(tok0 + ni * 8 + g, p.m - 1)) * k;

  float acc[2][NI][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[h][ni][q] = 0.0f;

  Raw<kFp4> cur;
  if (kb0 < kb1) load_raw<kFp4>(d, rt, kb0, lane, cur);
  for (int kb = kb0; kb < kb1; ++kb) {
    Raw<kFp4> nxt = cur;
    if (kb + 1 < kb1) load_raw<kFp4>(d, rt, kb + 1, lane, nxt);  // in flight during the math
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int c0 = kb * 64 + s * 16 + 2 * t;  // k % 8 == 0: a pair never straddles k
      uint32_t b[NI][2];
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        b[ni][0] = c0 < k ? __ldg(reinterpret_cast<const unsigned int*>(xrow[ni] + c0)) : 0u;
        b[ni][1] =
            c0 + 8 < k ? __ldg(reinterpret_cast<const unsigned int*>(xrow[ni] + c0 + 8)) : 0u;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t m_lo, m_hi;
        if constexpr (kFp4) {
          m_lo = nvfp4_mult((cur.sf[h][0] >> (8 * s)) & 0xFFu);
          m_hi = nvfp4_mult((cur.sf[h][1] >> (8 * s)) & 0xFFu);
        } else {
          fp8_mults(d, rt * 32 + h * 16 + g, kb * 64 + s * 16, m_lo, m_hi);
        }
        uint32_t a[4];
        decode_step<kFp4>(cur.w[h], s, m_lo, m_hi, a);
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_bf16(acc[h][ni], a, b[ni][0], b[ni][1]);
      }
    }
    cur = nxt;
  }

  // Accumulator q of (h, ni): row g + 8·(q / 2) of group h, token 2t + q % 2 of block ni.
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = rt * 32 + h * 16 + g + 8 * (q >> 1);
        const int tok = tok0 + ni * 8 + 2 * t + (q & 1);
        if (row >= p.w.n || tok >= p.m) continue;
        if (d.splits > 1) {
          static_cast<float*>(p.workspace)[(size_t(split) * p.m + tok) * p.w.n + row] =
              acc[h][ni][q];
        } else {
          store_out(d, tok, row, acc[h][ni][q]);
        }
      }
}

// out[tok, row] = Σ_s partial[s, tok, row] in split order, then the epilogue.
__global__ void __launch_bounds__(256) quant_gemm_reduce(DeviceArgs d) {
  const size_t total = size_t(d.p.m) * d.p.w.n;
  const float* ws = static_cast<const float*>(d.p.workspace);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < d.splits; ++s) v += ws[size_t(s) * total + i];
    store_out(d, int(i / d.p.w.n), int(i % d.p.w.n), v);
  }
}

// One thread per (row tile, k block, group, lane) chunk: the GEMM's decode, then scattered
// stores of the dequantized values.
template <bool kFp4>
__global__ void __launch_bounds__(256) dequant_kernel(DeviceArgs d, __nv_bfloat16* out) {
  const size_t chunk = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t chunks = size_t(d.n_tiles) * d.k_blocks * 64;
  if (chunk >= chunks) return;
  const int lane = int(chunk % 32), h = int(chunk / 32 % 2);
  const int kb = int(chunk / 64 % d.k_blocks), rt = int(chunk / 64 / d.k_blocks);
  const int g = lane >> 2, t = lane & 3;
  const QuantGemmWeight& w = d.p.w;
  Raw<kFp4> r;
  load_raw<kFp4>(d, rt, kb, lane, r);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint32_t m_lo, m_hi;
    if constexpr (kFp4) {
      m_lo = nvfp4_mult((r.sf[h][0] >> (8 * s)) & 0xFFu);
      m_hi = nvfp4_mult((r.sf[h][1] >> (8 * s)) & 0xFFu);
    } else {
      fp8_mults(d, rt * 32 + h * 16 + g, kb * 64 + s * 16, m_lo, m_hi);
    }
    uint32_t a[4];
    decode_step<kFp4>(r.w[h], s, m_lo, m_hi, a);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = rt * 32 + h * 16 + g + 8 * (i & 1);
        const int col = kb * 64 + s * 16 + 2 * t + 8 * (i >> 1) + half;
        if (row >= w.n || col >= w.k) continue;
        float v = __uint_as_float((half ? a[i] >> 16 : a[i] & 0xFFFFu) << 16) * d.alpha;
        if (d.row_scale) v *= d.row_scale[row];
        out[size_t(row) * w.k + col] = __float2bfloat16_rn(v);
      }
  }
}

int sm_count() {
  static const int count = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      v = 132;
    cudaGetLastError();
    return v > 0 ? v : 132;
  }();
  return count;
}

// Split-K factor: enough warps to cover the GPU (~32 per SM), at least 2 k blocks per split,
// and partial-sum traffic well under the weight bytes (s ≤ k / (64·m)).
int splits_for(int m, int n, int k) {
  const int n_tiles = quant_gemm_n_pad(n) / 32, k_blocks = quant_gemm_k_pad(k) / 64;
  int s = std::max(1, sm_count() * 32 / n_tiles);
  s = std::min(s, std::max(1, k_blocks / 2));
  s = std::min(s, std::max(1, k / (64 * std::max(m, 1))));
  return std::min(s, 32);
}

void validate(const QuantGemmWeight& w, const char* who) {
  const std::string name(who);
  if (w.n <= 0 || w.k <= 0 || w.k % 8 != 0)
    throw InvalidArgument(name + ": need n > 0 and k % 8 == 0, got n = " + std::to_string(w.n) +
                          ", k = " + std::to_string(w.k));
  if (w.format == WeightFormat::kNvfp4 && w.k % 16 != 0)
    throw InvalidArgument(name + ": NVFP4 needs k % 16 == 0, got k = " + std::to_string(w.k));
  if (w.format == WeightFormat::kFp8Block &&
      (w.block_n <= 0 || w.block_k <= 0 || w.block_k % 16 != 0))
    throw InvalidArgument(name + ": FP8 block needs block_n > 0 and block_k % 16 == 0, got " +
                          std::to_string(w.block_n) + " x " + std::to_string(w.block_k));
  if (w.format != WeightFormat::kFp8PerTensor && w.scales == nullptr)
    throw InvalidArgument(name + ": missing scales");
}

DeviceArgs device_args(const QuantGemmParams& p) {
  const QuantGemmWeight& w = p.w;
  DeviceArgs d{};
  d.p = p;
  d.alpha = w.format == WeightFormat::kNvfp4          ? w.global_scale * 128.0f
            : w.format == WeightFormat::kFp8PerTensor ? w.global_scale
                                                      : 1.0f;
  d.row_scale =
      w.format == WeightFormat::kFp8PerChannel ? static_cast<const float*>(w.scales) : nullptr;
  d.block = w.format == WeightFormat::kFp8Block ? static_cast<const uint16_t*>(w.scales) : nullptr;
  d.block_cols = w.format == WeightFormat::kFp8Block ? (w.k + w.block_k - 1) / w.block_k : 0;
  d.k_blocks = quant_gemm_k_pad(w.k) / 64;
  d.n_tiles = quant_gemm_n_pad(w.n) / 32;
  d.splits = 1;
  return d;
}

template <bool kFp4, int NI>
void launch(const DeviceArgs& d, cudaStream_t stream) {
  const dim3 grid((d.n_tiles + kWarps - 1) / kWarps, d.splits, (d.p.m + 8 * NI - 1) / (8 * NI));
  quant_gemm_kernel<kFp4, NI><<<grid, kWarps * 32, 0, stream>>>(d);
}

template <bool kFp4>
void launch_tiles(const DeviceArgs& d, cudaStream_t stream) {
  if (d.p.m <= 8) {
    launch<kFp4, 1>(d, stream);
  } else if (d.p.m <= 16) {
    launch<kFp4, 2>(d, stream);
  } else {
    launch<kFp4, 4>(d, stream);
  }
}

}  // namespace

int quant_gemm_n_pad(int n) {
  return (n + 31) / 32 * 32;
}
int quant_gemm_k_pad(int k) {
  return (k + 63) / 64 * 64;
}

size_t quant_gemm_data_bytes(WeightFormat format, int n, int k) {
  const size_t elems = size_t(quant_gemm_n_pad(n)) * quant_gemm_k_pad(k);
  return format == WeightFormat::kNvfp4 ? elems / 2 : elems;
}

std::vector<uint8_t> quant_gemm_pack_data(WeightFormat format, const uint8_t* src, int n, int k) {
  const bool fp4 = format == WeightFormat::kNvfp4;
  const int n_tiles = quant_gemm_n_pad(n) / 32, k_blocks = quant_gemm_k_pad(k) / 64;
  const int bytes_per_lane = fp4 ? 16 : 32;
  std::vector<uint8_t> out(quant_gemm_data_bytes(format, n, k), 0);
  // Row tiles write disjoint output ranges: pack them in parallel (a 70B model has ~5 G codes).
  ThreadPool::global().parallel_for(n_tiles, 4, [&](int64_t tile_begin, int64_t tile_end) {
    for (int rt = int(tile_begin); rt < int(tile_end); ++rt)
      for (int kb = 0; kb < k_blocks; ++kb)
        for (int h = 0; h < 2; ++h)
          for (int lane = 0; lane < 32; ++lane) {
            uint8_t* dst =
                out.data() + ((size_t(rt * k_blocks + kb) * 2 + h) * 32 + lane) * bytes_per_lane;
            const int g = lane / 4, t = lane % 4;
            for (int s = 0; s < 4; ++s)
              for (int i = 0; i < 4; ++i)
                for (int half = 0; half < 2; ++half) {
                  const int row = rt * 32 + h * 16 + g + 8 * (i & 1);
                  const int col = kb * 64 + s * 16 + 2 * t + 8 * (i >> 1) + half;
                  if (row >= n || col >= k) continue;  // padding stays code 0
                  if (fp4) {
                    const uint8_t byte = src[size_t(row) * (k / 2) + col / 2];
                    const uint8_t code = (col & 1) ? byte >> 4 : byte & 0xF;
                    const int nibble = half ? 7 - i : 3 - i;  // within word s
                    dst[4 * s + nibble / 2] |= uint8_t(code << (4 * (nibble & 1)));
                  } else {
                    const uint8_t code = src[size_t(row) * k + col];
                    const int word = 2 * s + (i >> 1);
                    const int byte = (i & 1) ? (half ? 2 : 0) : (half ? 3 : 1);
                    dst[4 * word + byte] = code;
                  }
                }
          }
  });
  return out;
}

std::vector<uint8_t> quant_gemm_pack_nvfp4_scales(const uint8_t* src, int n, int k) {
  const int cols = k / 16, cols_pad = quant_gemm_k_pad(k) / 16;
  std::vector<uint8_t> out(size_t(quant_gemm_n_pad(n)) * cols_pad, 0);
  for (int r = 0; r < n; ++r)
    std::copy(src + size_t(r) * cols, src + size_t(r + 1) * cols,
              out.data() + size_t(r) * cols_pad);
  return out;
}

std::vector<bf16> quant_gemm_pack_block_scales(const float* src, size_t count) {
  std::vector<bf16> out(count);
  for (size_t i = 0; i < count; ++i) {
    const float s = src[i];
    if (!(s >= 0.0f && s < 256.0f))
      throw InvalidArgument("FP8 block scale " + std::to_string(i) + " = " + std::to_string(s) +
                            " is outside [0, 256) (the CUDA GEMM folds 2^120 into bf16 scales)");
    out[i] = float_to_bf16(std::ldexp(s, 120));
  }
  return out;
}

size_t quant_gemm_workspace_bytes(int m, int n, int k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const int s = splits_for(m, n, k);
  return s > 1 ? size_t(s) * m * n * sizeof(float) : 0;
}

void quant_gemm(const QuantGemmParams& p, cudaStream_t stream) {
  validate(p.w, "quant_gemm");
  if (p.m <= 0) return;
  if (!is_aligned16(p.w.data) || (reinterpret_cast<uintptr_t>(p.x) & 3u) != 0)
    throw InvalidArgument("quant_gemm: weight data must be 16-byte and x 4-byte aligned");
  DeviceArgs d = device_args(p);
  d.splits = splits_for(p.m, p.w.n, p.w.k);
  if (d.splits > 1 && p.workspace_bytes < quant_gemm_workspace_bytes(p.m, p.w.n, p.w.k))
    throw InvalidArgument("quant_gemm: workspace too small (" + std::to_string(p.workspace_bytes) +
                          " < " + std::to_string(quant_gemm_workspace_bytes(p.m, p.w.n, p.w.k)) +
                          ")");
  if (p.w.format == WeightFormat::kNvfp4) {
    launch_tiles<true>(d, stream);
  } else {
    launch_tiles<false>(d, stream);
  }
  check_launch("quant_gemm");
  if (d.splits > 1) {
    const size_t total = size_t(p.m) * p.w.n;
    const int blocks = int(std::min<size_t>((total + 255) / 256, size_t(sm_count()) * 8));
    quant_gemm_reduce<<<blocks, 256, 0, stream>>>(d);
    check_launch("quant_gemm_reduce");
  }
}

void quant_dequant_bf16(const QuantGemmWeight& w, bf16* out, cudaStream_t stream) {
  validate(w, "quant_dequant_bf16");
  QuantGemmParams p{};
  p.w = w;
  const DeviceArgs d = device_args(p);
  const size_t chunks = size_t(d.n_tiles) * d.k_blocks * 64;
  const unsigned blocks = unsigned((chunks + 255) / 256);
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  if (w.format == WeightFormat::kNvfp4) {
    dequant_kernel<true><<<blocks, 256, 0, stream>>>(d, o);
  } else {
    dequant_kernel<false><<<blocks, 256, 0, stream>>>(d, o);
  }
  check_launch("quant_dequant_bf16");
}

}  // namespace serval::kernels::cuda
