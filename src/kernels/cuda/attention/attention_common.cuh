// Device building blocks of the paged attention kernels: cp.async KV tiles from the paged cache,
// fp8 → f16 tile conversion, mma.sync m16n8k16 fragments, online softmax in the log2 domain.
//
// Cache element types (template parameter C):
//   bf16:      tiles are staged by cp.async in mma-ready padded rows; the mma runs in bf16.
//   e4m3/e5m2: tiles are staged dense (D bytes per key row), converted to f16 in a separate
//              padded tile, and the mma runs in f16 (f32 accumulation). f16 represents every
//              e4m3 and e5m2 value exactly, so K and V enter the tensor cores unrounded; q is
//              converted bf16 → f16 (exact for 2^-14 ≤ |q| ≤ 65504: larger magnitudes saturate
//              to ±65504, smaller ones become f16 subnormals, absolute error ≤ 2^-25) and the
//              probabilities P are rounded to f16 (finer than bf16).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16/.f16), g = lane / 4, c = lane % 4:
//   A (16×16, row-major): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B (16×8, k × n):      b0 (k = 2c..2c+1, n = g), b1 (k = 2c+8.., n = g)
//   C (16×8, fp32):       c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
// Each warp owns 16 query rows; a thread holds rows g and g+8.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda::attn {

constexpr int kTileKeys = 64;  // keys per shared-memory KV tile
constexpr int kThreads = 128;  // 4 warps per CTA in both kernels

template <DType C>
constexpr bool kIsFp8 = C == DType::kF8E4M3 || C == DType::kF8E5M2;

// 16-bit elements per row of an mma-ready tile: +16 bytes keeps lds/ldmatrix conflict-free.
template <int D>
constexpr int kMmaStride = D + 8;

// Shared memory of one CTA: [stage 0: K | V][stage 1: K | V] staged tiles, then (fp8 only) the
// f16 K and V tiles the mma reads. Mma-ready tiles are 16-bit [kTileKeys][kStride].
template <int D, DType C>
struct TileShape {
  static constexpr bool kFp8 = kIsFp8<C>;
  static constexpr int kStride = kMmaStride<D>;
  static constexpr int kTileElems = kTileKeys * kStride;
  static constexpr int kElemBytes = kFp8 ? 1 : 2;
  // fp8 rows stay dense: a warp's cp.async writes and 8-byte conversion reads are contiguous.
  static constexpr int kStageRowBytes = kFp8 ? D : kStride * 2;
  static constexpr int kStageTileBytes = kTileKeys * kStageRowBytes;
  static constexpr size_t kStagesBytes = size_t(2) * 2 * kStageTileBytes;
  static constexpr size_t kConvertedBytes = kFp8 ? size_t(2) * kTileElems * 2 : 0;
  static constexpr size_t kSmemBytes = kStagesBytes + kConvertedBytes;
  static_assert(kStagesBytes % 16 == 0, "the converted tiles must stay 16-byte aligned");
};

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Two floats as a packed pair for the mma A operand: .x (low half) = lo.
template <bool kF16>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t r;
  if constexpr (kF16) {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}

// A bf16 pair re-encoded as an f16 pair; magnitudes above the f16 range saturate (NaN stays NaN).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v) {
  float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
  constexpr float kMax = 65504.0f;
  f.x = fabsf(f.x) > kMax ? copysignf(kMax, f.x) : f.x;
  f.y = fabsf(f.y) > kMax ? copysignf(kMax, f.y) : f.y;
  return pack_pair<true>(f.x, f.y);
}

template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four transposed 8×8 16-bit matrices; lane L supplies the row address of matrix L/8, row L%8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Issues cp.async for keys [key0, key0 + kTileKeys) of one KV head into the staged tiles sk/sv
// (rows of kStageRowBytes); keys ≥ key_end are zero-filled so masked lanes never multiply
// garbage (NaN) V. Caches are byte pointers to elements of C.
template <int D, DType C>
__device__ __forceinline__ void load_kv_tile(unsigned char* sk, unsigned char* sv,
                                             const unsigned char* k_cache,
                                             const unsigned char* v_cache, const int32_t* table,
                                             int block_size, int num_kv_heads, int kv_head,
                                             int key0, int key_end) {
  using L = TileShape<D, C>;
  constexpr int kChunkElems = 16 / L::kElemBytes;  // elements per 16-byte chunk
  constexpr int kChunks = D / kChunkElems;         // chunks per key row
  for (int c = threadIdx.x; c < kTileKeys * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * kChunkElems;
    const int key = key0 + r;
    const bool valid = key < key_end;
    int64_t off = 0;  // bytes
    if (valid) {
      const int64_t slot = int64_t(table[key / block_size]) * block_size + key % block_size;
      off = ((slot * num_kv_heads + kv_head) * D + col) * L::kElemBytes;
    }
    const int dst = r * L::kStageRowBytes + col * L::kElemBytes;
    cp_async_16(sk + dst, k_cache + off, valid);
    cp_async_16(sv + dst, v_cache + off, valid);
  }
}

// Four fp8 values (element 0 in the low byte of w) as two f16 pairs: lo = elements 0, 1 and
// hi = elements 2, 3, the lower element in the low half. Exact.
template <DType C>
__device__ __forceinline__ void fp8x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (C == DType::kF8E4M3) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xFFFFu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
    lo = uint32_t(a.x) | (uint32_t(a.y) << 16);
    hi = uint32_t(b.x) | (uint32_t(b.y) << 16);
  } else {
    static_assert(C == DType::kF8E5M2);
    // An e5m2 byte is the high byte of the f16 with the same value (same sign, exponent bias 15,
    // mantissa truncated to 2 bits): byte i goes to bits 8..15 of half i, zeros below.
    lo = __byte_perm(w, 0u, 0x1404);
    hi = __byte_perm(w, 0u, 0x3424);
  }
}

// Converts rows [row0, row0 + rows) of the staged fp8 tiles sk8/sv8 (dense, D bytes per row) into
// the f16 tiles dk/dv ([kTileKeys][kStride]); work split over `nthreads` threads from `tid`.
// Units of 8 elements: one 8-byte shared load, one 16-byte shared store.
template <int D, DType C>
__device__ __forceinline__ void convert_tile_rows(uint16_t* dk, uint16_t* dv,
                                                  const unsigned char* sk8,
                                                  const unsigned char* sv8, int row0, int rows,
                                                  int tid, int nthreads) {
  constexpr int kUnits = D / 8;
  constexpr int kStride = kMmaStride<D>;
  for (int u = tid; u < rows * kUnits; u += nthreads) {
    const int r = row0 + u / kUnits, col = (u % kUnits) * 8;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      const uint2 raw = *reinterpret_cast<const uint2*>((kv ? sv8 : sk8) + r * D + col);
      uint32_t h0, h1, h2, h3;
      fp8x4_to_f16x4<C>(raw.x, h0, h1);
      fp8x4_to_f16x4<C>(raw.y, h2, h3);
      // One 16-byte store (left to itself, nvcc splits it into four 4-byte stores).
      const uint32_t addr = uint32_t(__cvta_generic_to_shared((kv ? dv : dk) + r * kStride + col));
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(h0), "r"(h1),
                   "r"(h2), "r"(h3)
                   : "memory");
    }
  }
}

// A fragments of the warp's 16 query rows (bf16 in global memory, re-encoded as f16 when kF16);
// null row pointers give zero rows.
template <int D, bool kF16>
__device__ __forceinline__ void load_q_frags(uint32_t (&qa)[D / 16][4], const __nv_bfloat16* lo,
                                             const __nv_bfloat16* hi, int c) {
  auto ld = [](const __nv_bfloat16* p) {
    const uint32_t v = *reinterpret_cast<const uint32_t*>(p);
    if constexpr (kF16) {
      return bf16x2_to_f16x2(v);
    } else {
      return v;
    }
  };
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int col = kk * 16 + 2 * c;
    qa[kk][0] = lo ? ld(lo + col) : 0u;
    qa[kk][1] = hi ? ld(hi + col) : 0u;
    qa[kk][2] = lo ? ld(lo + col + 8) : 0u;
    qa[kk][3] = hi ? ld(hi + col + 8) : 0u;
  }
}

// s[j] = Q · K[8j .. 8j+7]ᵀ for the keys starting at smem row `sk` (raw dot products).
template <int D, int kNt, bool kF16>
__device__ __forceinline__ void qk_scores(float (&s)[kNt][4], const uint32_t (&qa)[D / 16][4],
                                          const uint16_t* sk, int g, int c) {
  constexpr int kStride = kMmaStride<D>;
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const uint16_t* row = sk + (8 * j + g) * kStride + 2 * c;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      mma_16816<kF16>(s[j], qa[kk], ld32(row + kk * 16), ld32(row + kk * 16 + 8));
  }
}

// Online softmax over one block of scores already in the log2 domain (scale·log2e applied,
// masked entries −inf). Updates the running max m and the thread-partial sums l of rows g
// (index 0) and g+8 (index 1), rescales o, and turns s into probabilities.
template <int kNt, int kOt>
__device__ __forceinline__ void online_softmax(float (&s)[kNt][4], float (&m)[2], float (&l)[2],
                                               float (&o)[kOt][4]) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // the 4 lanes of a quad share rows g, g+8
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
  }
  float base[2], corr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    base[i] = mx[i] == -INFINITY ? 0.0f : mx[i];  // all masked so far: avoid (−inf) − (−inf)
    corr[i] = exp2f(m[i] - base[i]);
    m[i] = mx[i];
    l[i] *= corr[i];
  }
#pragma unroll
  for (int n = 0; n < kOt; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    s[j][0] = exp2f(s[j][0] - base[0]);
    s[j][1] = exp2f(s[j][1] - base[0]);
    s[j][2] = exp2f(s[j][2] - base[1]);
    s[j][3] = exp2f(s[j][3] - base[1]);
    l[0] += s[j][0] + s[j][1];
    l[1] += s[j][2] + s[j][3];
  }
}

// o += P · V for the kNt·8 keys starting at smem row `sv`; P comes from C fragments (rows g, g+8).
template <int D, int kNt, bool kF16>
__device__ __forceinline__ void pv_accumulate(float (&o)[D / 8][4], const float (&p)[kNt][4],
                                              const uint16_t* sv, int lane) {
  constexpr int kStride = kMmaStride<D>;
  // ldmatrix row address of this lane: key (lane & 7) + 8·((lane >> 3) & 1), dims +8·(lane >> 4).
  const uint16_t* base = sv + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8;
#pragma unroll
  for (int q = 0; q < kNt / 2; ++q) {  // 16 keys per k-step
    const uint32_t pa[4] = {pack_pair<kF16>(p[2 * q][0], p[2 * q][1]),
                            pack_pair<kF16>(p[2 * q][2], p[2 * q][3]),
                            pack_pair<kF16>(p[2 * q + 1][0], p[2 * q + 1][1]),
                            pack_pair<kF16>(p[2 * q + 1][2], p[2 * q + 1][3])};
#pragma unroll
    for (int d = 0; d < D / 16; ++d) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + q * 16 * kStride + d * 16);
      mma_16816<kF16>(o[2 * d], pa, b[0], b[1]);
      mma_16816<kF16>(o[2 * d + 1], pa, b[2], b[3]);
    }
  }
}

// Sums the thread-partial row sums over the quad.
__device__ __forceinline__ void reduce_row_sums(float (&l)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
}

}  // namespace serval::kernels::cuda::attn
