// Device building blocks of the paged attention kernels: cp.async KV tiles from the paged cache,
// bf16 mma.sync m16n8k16 fragments, online softmax in the log2 domain.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16), g = lane / 4, c = lane % 4:
//   A (16×16, row-major): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B (16×8, k × n):      b0 (k = 2c..2c+1, n = g), b1 (k = 2c+8.., n = g)
//   C (16×8, fp32):       c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
// Each warp owns 16 query rows; a thread holds rows g and g+8.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace serval::kernels::cuda::attn {

constexpr int kTileKeys = 64;  // keys per shared-memory KV tile
constexpr int kThreads = 128;  // 4 warps per CTA in both kernels

template <int D>
struct TileShape {
  static constexpr int kStride = D + 8;  // bf16 per smem row: +16 bytes keeps lds conflict-free
  static constexpr int kTileElems = kTileKeys * kStride;
  // Two pipeline stages of K and V.
  static constexpr size_t kSmemBytes = size_t(2) * 2 * kTileElems * sizeof(__nv_bfloat16);
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

__device__ __forceinline__ uint32_t ld32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four transposed 8×8 bf16 matrices; lane L supplies the row address of matrix L/8, row L%8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Issues cp.async for keys [key0, key0 + kTileKeys) of one KV head into sk/sv (row stride
// kStride); keys ≥ key_end are zero-filled so masked lanes never multiply garbage (NaN) V.
template <int D>
__device__ __forceinline__ void load_kv_tile(__nv_bfloat16* sk, __nv_bfloat16* sv,
                                             const __nv_bfloat16* k_cache,
                                             const __nv_bfloat16* v_cache, const int32_t* table,
                                             int block_size, int num_kv_heads, int kv_head,
                                             int key0, int key_end) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per key row
  constexpr int kStride = TileShape<D>::kStride;
  for (int c = threadIdx.x; c < kTileKeys * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const int key = key0 + r;
    const bool valid = key < key_end;
    int64_t off = 0;
    if (valid) {
      const int64_t slot = int64_t(table[key / block_size]) * block_size + key % block_size;
      off = (slot * num_kv_heads + kv_head) * D + col;
    }
    cp_async_16(sk + r * kStride + col, k_cache + off, valid);
    cp_async_16(sv + r * kStride + col, v_cache + off, valid);
  }
}

// A fragments of the warp's 16 query rows; null row pointers give zero rows.
template <int D>
__device__ __forceinline__ void load_q_frags(uint32_t (&qa)[D / 16][4], const __nv_bfloat16* lo,
                                             const __nv_bfloat16* hi, int c) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int col = kk * 16 + 2 * c;
    qa[kk][0] = lo ? ld32(lo + col) : 0u;
    qa[kk][1] = hi ? ld32(hi + col) : 0u;
    qa[kk][2] = lo ? ld32(lo + col + 8) : 0u;
    qa[kk][3] = hi ? ld32(hi + col + 8) : 0u;
  }
}

// s[j] = Q · K[8j .. 8j+7]ᵀ for the keys starting at smem row `sk` (raw dot products).
template <int D, int kNt>
__device__ __forceinline__ void qk_scores(float (&s)[kNt][4], const uint32_t (&qa)[D / 16][4],
                                          const __nv_bfloat16* sk, int g, int c) {
  constexpr int kStride = TileShape<D>::kStride;
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const __nv_bfloat16* row = sk + (8 * j + g) * kStride + 2 * c;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      mma_16816(s[j], qa[kk], ld32(row + kk * 16), ld32(row + kk * 16 + 8));
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
template <int D, int kNt>
__device__ __forceinline__ void pv_accumulate(float (&o)[D / 8][4], const float (&p)[kNt][4],
                                              const __nv_bfloat16* sv, int lane) {
  constexpr int kStride = TileShape<D>::kStride;
  // ldmatrix row address of this lane: key (lane & 7) + 8·((lane >> 3) & 1), dims +8·(lane >> 4).
  const __nv_bfloat16* base = sv + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8;
#pragma unroll
  for (int q = 0; q < kNt / 2; ++q) {  // 16 keys per k-step
    const uint32_t pa[4] = {
        pack_bf16(p[2 * q][0], p[2 * q][1]), pack_bf16(p[2 * q][2], p[2 * q][3]),
        pack_bf16(p[2 * q + 1][0], p[2 * q + 1][1]), pack_bf16(p[2 * q + 1][2], p[2 * q + 1][3])};
#pragma unroll
    for (int d = 0; d < D / 16; ++d) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + q * 16 * kStride + d * 16);
      mma_16816(o[2 * d], pa, b[0], b[1]);
      mma_16816(o[2 * d + 1], pa, b[2], b[3]);
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
