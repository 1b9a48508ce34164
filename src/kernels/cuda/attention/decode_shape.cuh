// The decode attention CTA's geometry (paged_decode.cu): its shared-memory KV stages (DecodeShape)
// and q staged once as every lane's mma A fragments (QStage). Included only by paged_decode.cu and
// the decode_*.cuh headers it uses.
#pragma once
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/attention/decode_merge.cuh"

namespace serval::kernels::cuda::decode {

using namespace attn;

constexpr int kNarrowWarps = kThreads / 32;  // warps of the usual decode CTA
constexpr int kWideWarps = 8;                // of a CTA alone on its SM (small grids)

// One decode CTA of W warps, each taking 16 keys of every [kTileKeys = 16·W]-key tile. Its
// shared memory: kStages × [K tile | V tile], each [kTileKeys][kRowBytes]. bf16 rows are
// mma-ready (kMmaStride<D> elements); fp8 rows are D bytes + 16 of padding. Both paddings shift
// consecutive rows by 4 banks: fragment loads and ldmatrix are conflict-free. The narrow CTA (4
// warps) is sized so that three fit on an SM at head_dim 128 (paged_attention.cu assumes it);
// the wide one (8 warps, ≥ 160 registers) runs alone on its SM, with stages of 128 keys: three
// with fp8 (110 KB), two with bf16 (139 KB; three, 209 KB, made it lose at batch 2-8 × 1024).
template <int D, DType C, int W = kNarrowWarps>
struct DecodeShape {
  static constexpr int kWarps = W;
  static constexpr int kCtaThreads = 32 * W;
  static constexpr int kTileKeys = 16 * W;
  static constexpr int kCtasPerSm = W == kNarrowWarps ? kDecodeCtasPerSm : 1;
  static constexpr bool kFp8 = kIsFp8<C>;
  static constexpr int kElemBytes = kFp8 ? 1 : 2;
  static constexpr int kRowBytes = kFp8 ? D + 16 : kMmaStride<D> * 2;
  static constexpr int kStages = !kFp8 ? 2 : W == kNarrowWarps ? 4 : 3;  // see above
  static constexpr int kTileBytes = kTileKeys * kRowBytes;
  static constexpr int kSmemBytes = kStages * 2 * kTileBytes;
  static constexpr int kChunks = D * kElemBytes / 16;          // 16-byte chunks per key row
  static constexpr int kRowStep = kCtaThreads / kChunks;       // rows between a thread's chunks
  static constexpr int kRowsPerThread = kTileKeys / kRowStep;  // key rows each thread copies
  static_assert(kCtaThreads % kChunks == 0 && kTileKeys % kRowStep == 0);
  static_assert(size_t(kSmemBytes) + 2 * W * 16 * sizeof(float) <= 227 * 1024,
                "the stages and the per-warp softmax state fit an SM's shared memory");
  static_assert(kRowBytes % 16 == 0, "cp.async and ldmatrix need 16-byte aligned rows");
  // Epilogue: the per-warp outputs [warp][16][kOStride] fp32 reuse the stages. The padding makes
  // the fragment stores conflict-free (bf16: float2 stores, 8g + 2c spans 32 banks per half warp)
  // or 2-way (fp8: scalar stores of dims 4c apart, g + 4c).
  static constexpr int kOStride = kFp8 ? D + 1 : D + 8;
  static_assert(size_t(W) * 16 * kOStride * sizeof(float) <= size_t(kSmemBytes),
                "the epilogue reuses the stages for the per-warp outputs");
  static_assert(size_t(attn::kMergeScratchFloats) * sizeof(float) <= size_t(kSmemBytes),
                "the fused merge reuses the stages for its weights");
};

// q of a CTA's 16 mma rows, staged once in shared memory as every lane's A fragments so that a
// warp reads its fragments with D/16 16-byte loads: [D/16 k-steps][32 lanes][4 words] (word i as
// load_q_frags orders a0..a3). The CTA's kCtaThreads threads load q with one 4-byte load per bf16
// pair and (fp8 caches) convert it to f16 once, instead of every warp loading and converting all of
// it (ncu, b1: that was a fifth of each warp's instructions). fp8 caches permute the dims to match
// qk_scores_fp8: within each 16-dim k-step, mma k-indices 2c, 2c+1 hold dims 4c, 4c+1 and
// k-indices 2c+8, 2c+9 hold dims 4c+2, 4c+3. Rows ≥ num_rows are zero.
template <int D, bool kFp8, int kCtaThreads = kThreads>
struct QStage {
  static constexpr int kWords = 16 * D / 2;  // rows × bf16 pairs
  static constexpr int kPerThread = kWords / kCtaThreads;
  static constexpr int kBytes = kWords * 4;
  static_assert(kWords % kCtaThreads == 0);

  // Word w of the row-major [16][D/2] pairs: row w / (D/2), dims 2·(w % (D/2)) + {0, 1}.
  __device__ __forceinline__ static int word(int k) { return int(threadIdx.x) + k * kCtaThreads; }

  // Fragment word holding dims (d, d + 1) (d even) of row r.
  __device__ __forceinline__ static int frag_word(int r, int d) {
    const int kk = d / 16, w = d % 16;
    const int c = kFp8 ? w / 4 : (w % 8) / 2;
    const int high_k = kFp8 ? (w / 2) % 2 : w / 8;  // k-index 8.. of the step: a2 / a3
    const int lane = (r % 8) * 4 + c;
    return (kk * 32 + lane) * 4 + (r >= 8 ? 1 : 0) + 2 * high_k;
  }

  // This thread's pairs of q (rows < num_rows; `rows` points at row 0, rows D apart).
  __device__ __forceinline__ static void load(uint32_t (&pairs)[kPerThread],
                                              const __nv_bfloat16* rows, int num_rows) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int w = word(k), r = w / (D / 2);
      pairs[k] = r < num_rows ? ld32(reinterpret_cast<const uint16_t*>(rows + 2 * w)) : 0u;
    }
  }

  // Stores this thread's pairs (fp8: as f16) into `staged` in fragment order.
  __device__ __forceinline__ static void store(uint32_t* staged,
                                               const uint32_t (&pairs)[kPerThread]) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int w = word(k);
      staged[frag_word(w / (D / 2), 2 * (w % (D / 2)))] =
          kFp8 ? bf16x2_to_f16x2(pairs[k]) : pairs[k];
    }
  }

  // This lane's fragments (after a barrier that follows every thread's store).
  __device__ __forceinline__ static void read(uint32_t (&qa)[D / 16][4], const uint32_t* staged,
                                              int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint4 v = reinterpret_cast<const uint4*>(staged)[kk * 32 + lane];
      qa[kk][0] = v.x;
      qa[kk][1] = v.y;
      qa[kk][2] = v.z;
      qa[kk][3] = v.w;
    }
  }
};

}  // namespace serval::kernels::cuda::decode
