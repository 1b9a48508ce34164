// Device building blocks of the paged decode attention kernel: tile constants, Q·Kᵀ scores,
// online softmax in the log2 domain, P·V accumulation (the mma primitives are in
// mma_fragments.cuh, shared with prefill).
//
// Cache element types (template parameter C): bf16 tiles run the mma in bf16; e4m3/e5m2 tiles run
// it in f16 (f32 accumulation). f16 represents every e4m3 and e5m2 value exactly, so K and V enter
// the tensor cores unrounded; q is converted bf16 → f16 (exact for 2^-14 ≤ |q| ≤ 65504: larger
// magnitudes saturate to ±65504, smaller ones become f16 subnormals, absolute error ≤ 2^-25) and
// the probabilities P are rounded to f16 (finer than bf16).
// Each warp owns 16 query rows; a thread holds rows g and g+8 (fragment layouts:
// mma_fragments.cuh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/attention/mma_fragments.cuh"

namespace serval::kernels::cuda::attn {

constexpr int kTileKeys = 64;  // keys per shared-memory KV tile

// A paged cache's block size, with its log2 when it is a power of two so that key → (block, offset
// in the block) is a shift and a mask (a division otherwise): the copies' address arithmetic sits
// on the attention kernels' critical path (a division per 16-byte copy cost the wgmma prefill
// kernel 11 %, measured on the H200).
struct PagedBlocks {
  int size, log2;  // log2 < 0: size is not a power of two
  __device__ __forceinline__ explicit PagedBlocks(int block_size) : size(block_size), log2(-1) {
    if ((size & (size - 1)) == 0) log2 = __ffs(size) - 1;
  }
  // key's block and its position in that block, for callers that test kPow2 (log2 >= 0) once.
  template <bool kPow2>
  __device__ __forceinline__ int block_of(int key) const {
    return kPow2 ? key >> log2 : key / size;
  }
  template <bool kPow2>
  __device__ __forceinline__ int within(int key, int block) const {
    return kPow2 ? key & (size - 1) : key - block * size;
  }
  __device__ __forceinline__ int block(int key) const {
    return log2 >= 0 ? key >> log2 : key / size;
  }
  // `key`'s position in its block.
  __device__ __forceinline__ int in_block(int key) const {
    return log2 >= 0 ? key & (size - 1) : key - (key / size) * size;
  }
  // Cache slot of `key`, whose block's table entry is `entry`.
  __device__ __forceinline__ int64_t slot(int entry, int key) const {
    return int64_t(entry) * size + in_block(key);
  }
  // The same in 32-bit arithmetic, for caches of fewer than 2^31 slots (the decode kernel).
  __device__ __forceinline__ int slot32(int entry, int key) const {
    return entry * size + in_block(key);
  }
};
constexpr int kThreads = 128;  // 4 warps per decode CTA

template <DType C>
constexpr bool kIsFp8 = C == DType::kF8E4M3 || C == DType::kF8E5M2;

// 16-bit elements per row of an mma-ready tile: +16 bytes keeps lds/ldmatrix conflict-free.
template <int D>
constexpr int kMmaStride = D + 8;

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
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

// o rows g (0) and g + 8 (1) times corr.
template <int kOt>
__device__ __forceinline__ void rescale_rows(float (&o)[kOt][4], const float (&corr)[2]) {
#pragma unroll
  for (int n = 0; n < kOt; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
}

// s = 2^(s · scale_log2 − ms[row]) for rows g (ms[0]) and g + 8 (ms[1]), one FFMA and one MUFU
// (ex2.approx.ftz) each, added to the thread-partial row sums l. Both online softmaxes end here.
template <int kNt>
__device__ __forceinline__ void exp2_probs(float (&s)[kNt][4], const float (&ms)[2],
                                           float scale_log2, float (&l)[2]) {
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    s[j][0] = fast_exp2(fmaf(s[j][0], scale_log2, -ms[0]));
    s[j][1] = fast_exp2(fmaf(s[j][1], scale_log2, -ms[0]));
    s[j][2] = fast_exp2(fmaf(s[j][2], scale_log2, -ms[1]));
    s[j][3] = fast_exp2(fmaf(s[j][3], scale_log2, -ms[1]));
    l[0] += s[j][0] + s[j][1];
    l[1] += s[j][2] + s[j][3];
  }
}

// Decode: −inf for the scores s (keys key0 + 8j + 2c, +1 of rows g and g + 8) at or past key_end.
template <int kNt>
__device__ __forceinline__ void mask_keys(float (&s)[kNt][4], int key0, int key_end, int c) {
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    const int key = key0 + 8 * j + 2 * c;
    if (key >= key_end) s[j][0] = s[j][2] = -INFINITY;
    if (key + 1 >= key_end) s[j][1] = s[j][3] = -INFINITY;
  }
}

// How far (log2) a decode row's max may rise above its softmax base before the base moves.
constexpr float kLazyRescaleLog2 = 8.0f;

// Decode online softmax over one block of raw scores (masked entries −inf; scale_log2 = scale ·
// log2 e > 0, so raw and scaled maxima order alike) with lazy rescaling: a row's base m (the
// exponent offset of its probabilities, of o and of l) moves only when the block's scaled max
// exceeds it by more than kLazyRescaleLog2, and then for every row of the warp at once. So o is
// rescaled (4·kOt multiplies) only when some max jumps, not whenever it creeps up (with random
// scores that was two tiles in three: ncu, Llama-70B shape). Probabilities stay ≤ 2^8, which f16,
// bf16 and the fp32 o and l hold without loss; the epilogue merges with the bases, which give the
// same o / l as the maxima would. One ex2.approx.ftz each: probabilities below 2^-126 flush to 0
// (they are 0 in f16 / bf16 P anyway). Updates m, the thread-partial sums l of rows g (index 0)
// and g+8 (index 1), rescales o, and turns s into probabilities.
template <int kNt, int kOt>
__device__ __forceinline__ void online_softmax_lazy(float (&s)[kNt][4], float (&m)[2],
                                                    float (&l)[2], float (&o)[kOt][4],
                                                    float scale_log2) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
  }
  bool rise = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // the 4 lanes of a quad share rows g, g+8
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    mx[i] *= scale_log2;                      // −inf stays −inf
    rise |= mx[i] > m[i] + kLazyRescaleLog2;  // m = −inf: any finite max
  }
  if (__any_sync(0xffffffffu, rise)) {
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float base = fmaxf(m[i], mx[i]);
      corr[i] = base == m[i] ? 1.0f : fast_exp2(m[i] - base);  // m = −inf: 0 (o, l are 0)
      m[i] = base;
      l[i] *= corr[i];
    }
    rescale_rows(o, corr);
  }
  float ms[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) ms[i] = m[i] == -INFINITY ? 0.0f : m[i];  // all masked so far
  exp2_probs(s, ms, scale_log2, l);
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

// Prefill: the (sequence, query tile, q heads) a CTA of `cta_rows` (query row, q head) pairs
// owns, from grid (q head groups, sequences, query tiles) with blockIdx.z = 0 the LAST
// (heaviest, causally longest) tile of its sequence. Read after pdl_wait (the metadata comes from
// the step's upload). tiles_left < 0: this sequence has fewer query tiles (the CTA returns).
struct PrefillCtaWork {
  int q_begin, q_len;  // the sequence's first token and query length
  int p0;              // first query row of the CTA
  int positions;       // query rows of the CTA
  int prefix;          // position of query row i is prefix + i
  int num_keys;        // keys the CTA may need (causal)
  int head0, kv_head;  // first q head, its KV head
  int tiles_left;
  const int32_t* table;  // the sequence's block table
};
__device__ __forceinline__ PrefillCtaWork prefill_cta_work(
    const int32_t* query_start, const int32_t* context_lens, const int32_t* block_tables,
    int max_blocks_per_seq, int num_q_heads, int num_kv_heads, int log_hpc, int cta_rows) {
  PrefillCtaWork w;
  const int seq = blockIdx.y;
  w.q_begin = query_start[seq];
  w.q_len = query_start[seq + 1] - w.q_begin;
  w.positions = cta_rows >> log_hpc;
  w.tiles_left = (w.q_len + w.positions - 1) / w.positions - 1 - int(blockIdx.z);
  w.p0 = w.tiles_left * w.positions;
  w.prefix = context_lens[seq] - w.q_len;
  w.num_keys = w.prefix + min(w.p0 + w.positions, w.q_len);
  w.head0 = int(blockIdx.x) << log_hpc;
  w.kv_head = w.head0 / (num_q_heads / num_kv_heads);
  w.table = block_tables + int64_t(seq) * max_blocks_per_seq;
  return w;
}

// Prefill: −inf for the keys of the score columns s (key0 + 8j + 2c, +1; rows g and g + 8 at
// positions pos_lo, pos_hi) that lie past their row's position (causal).
template <int kNt>
__device__ __forceinline__ void causal_mask(float (&s)[kNt][4], int key0, int c, int pos_lo,
                                            int pos_hi) {
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    const int key = key0 + 8 * j + 2 * c;
    if (key > pos_lo) s[j][0] = -INFINITY;
    if (key + 1 > pos_lo) s[j][1] = -INFINITY;
    if (key > pos_hi) s[j][2] = -INFINITY;
    if (key + 1 > pos_hi) s[j][3] = -INFINITY;
  }
}

// Prefill online softmax on raw scores s (scale_log2 = scale · log2 e > 0, so the running max m
// is taken before scaling): probabilities 2^(s·scale_log2 − m·scale_log2), one FFMA and one MUFU
// each. Updates m and the thread-partial sums l of rows g (0) and g + 8 (1), rescales o.
template <int kNt, int kOt>
__device__ __forceinline__ void online_softmax_raw(float (&s)[kNt][4], float (&m)[2], float (&l)[2],
                                                   float (&o)[kOt][4], float scale_log2) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
  }
  float ms[2], corr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // the 4 lanes of a quad share rows g, g+8
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float base = mx[i] == -INFINITY ? 0.0f : mx[i];  // never (−inf) − (−inf)
    corr[i] = fast_exp2((m[i] - base) * scale_log2);       // m = −inf: 0
    m[i] = mx[i];
    ms[i] = base * scale_log2;
    l[i] *= corr[i];
  }
  rescale_rows(o, corr);
  exp2_probs(s, ms, scale_log2, l);
}

// Prefill epilogue: rows g and g + 8 of o (query rows row_lo, row_hi of the sequence starting at
// token q_begin, q head `head`) times inv_lo / inv_hi as bf16, rows ≥ q_len skipped.
template <int D>
__device__ __forceinline__ void store_rows(__nv_bfloat16* out, const float (&o)[D / 8][4],
                                           int64_t q_begin, int num_q_heads, int head, int row_lo,
                                           int row_hi, int q_len, int c, float inv_lo,
                                           float inv_hi) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = n * 8 + 2 * c;
    if (row_lo < q_len) {
      *reinterpret_cast<__nv_bfloat162*>(out + ((q_begin + row_lo) * num_q_heads + head) * D +
                                         col) =
          __floats2bfloat162_rn(o[n][0] * inv_lo, o[n][1] * inv_lo);
    }
    if (row_hi < q_len) {
      *reinterpret_cast<__nv_bfloat162*>(out + ((q_begin + row_hi) * num_q_heads + head) * D +
                                         col) =
          __floats2bfloat162_rn(o[n][2] * inv_hi, o[n][3] * inv_hi);
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
