// Flash-attention prefill over the paged cache (FlashAttention-2 style, mma.sync m16n8k16, fp32
// accumulators), for every case the wgmma kernel (paged_prefill_wgmma.cu: head_dim 128) does not
// take.
//
// Work split: a CTA of 8 warps owns 128 (query row, q head) pairs of one sequence: hpc q heads of
// one KV head (hpc = the largest power of two ≤ 8 dividing the GQA group) × 128 / hpc consecutive
// query positions. Warp w takes q head (w mod hpc) and the 16 positions starting at
// 16·(w / hpc); all warps share every K/V tile, so GQA heads reuse one load. The grid is
// (Hq / hpc, num_seqs, query tiles) with blockIdx.z = 0 the LAST (heaviest, causally longest)
// tile of every sequence: CTAs are dispatched heaviest first and the tail is short.
//
// Per CTA: K/V tiles of 64 keys, cp.async into kStages shared-memory stages (page-table lookups
// per key row as the tile is issued), one __syncthreads per tile (bf16). S = Q·Kᵀ with Q held in
// registers and K fragments by ldmatrix; online softmax in the log2 domain (exp2 of
// s·scale·log2e − m·scale·log2e as one FFMA + MUFU); causal masking only on tiles that reach past
// the warp's first position; P stays in registers as the A operand of O += P·V (V fragments by
// ldmatrix.trans). fp8 caches: tiles are staged dense and converted to f16 once per tile in a
// separate padded tile (a second barrier), and the mma runs in f16.
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/attention/mma_fragments.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"

namespace serval::kernels::cuda {
namespace {

using namespace attn;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kCtaRows = kWarps * 16;  // (query row, q head) pairs per CTA
constexpr int kKeys = 64;              // keys per K/V tile
constexpr int kNt = kKeys / 8;         // score n-tiles per warp per tile
constexpr int kStages = 3;             // cp.async pipeline depth

// Shared memory: kStages × [K tile | V tile] as staged by cp.async, then (fp8 only) the f16 K and V
// tiles the mma reads. Mma-ready tiles are 16-bit [kKeys][kStride]; the +8 elements (16 bytes) per
// row put the 8 rows of an ldmatrix matrix in 8 distinct 16-byte bank groups.
template <int D, DType C>
struct Shape {
  static constexpr bool kFp8 = C == DType::kF8E4M3 || C == DType::kF8E5M2;
  static constexpr int kStride = D + 8;
  static constexpr int kTileElems = kKeys * kStride;
  static constexpr int kElemBytes = kFp8 ? 1 : 2;
  // fp8 rows stay dense: contiguous cp.async writes and 8-byte conversion reads.
  static constexpr int kStageRowBytes = kFp8 ? D : kStride * 2;
  static constexpr int kTileBytes = kKeys * kStageRowBytes;  // one staged K (or V) tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr size_t kStagesBytes = size_t(kStages) * kStageBytes;
  static constexpr size_t kSmemBytes = kStagesBytes + (kFp8 ? size_t(2) * kTileElems * 2 : 0);
  static constexpr int kChunkElems = 16 / kElemBytes;  // elements per 16-byte cp.async
  static constexpr int kChunks = D / kChunkElems;      // cp.async chunks per key row
  static_assert(kTileBytes % 16 == 0 && kStagesBytes % 16 == 0, "16-byte aligned tiles");
  static_assert(kStride == kMmaStride<D>, "pv_accumulate reads rows of kMmaStride elements");
};

// Issues cp.async for keys [key0, key0 + kKeys) of one KV head into `stage` ([K | V], rows of
// kStageRowBytes); keys ≥ num_keys are zero-filled (never read from the cache), so masked lanes
// multiply zeros, never stale or NaN values, in P·V.
template <int D, DType C>
__device__ __forceinline__ void load_tile(unsigned char* stage, const unsigned char* k_cache,
                                          const unsigned char* v_cache, const int32_t* table,
                                          const PagedBlocks& blocks, int num_kv_heads, int kv_head,
                                          int key0, int num_keys) {
  using S = Shape<D, C>;
  constexpr int kTotal = kKeys * S::kChunks;
  constexpr int kIters = (kTotal + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = int(threadIdx.x) + it * kThreads;
    if (kTotal % kThreads != 0 && i >= kTotal) break;
    const int r = i / S::kChunks, col = (i % S::kChunks) * S::kChunkElems;
    const int key = key0 + r;
    const bool valid = key < num_keys;
    int64_t off = 0;  // bytes
    if (valid) {
      const int64_t slot = blocks.slot(table[blocks.block(key)], key);
      off = ((slot * num_kv_heads + kv_head) * D + col) * S::kElemBytes;
    }
    const int dst = r * S::kStageRowBytes + col * S::kElemBytes;
    cp_async_16(stage + dst, k_cache + off, valid);
    cp_async_16(stage + S::kTileBytes + dst, v_cache + off, valid);
  }
}

// Converts the staged fp8 K and V tiles (dense, D bytes per row) into the f16 tiles dk/dv
// ([kKeys][kStride]), all kKeys rows (zero-filled rows stay zero). Units of 8 elements: one 8-byte
// shared load, one 16-byte shared store.
template <int D, DType C>
__device__ __forceinline__ void convert_tile(uint16_t* dk, uint16_t* dv, const unsigned char* sk8,
                                             const unsigned char* sv8) {
  constexpr int kUnits = kKeys * D / 8;
  constexpr int kStride = Shape<D, C>::kStride;
  static_assert(kUnits % kThreads == 0, "every thread converts the same number of units");
#pragma unroll
  for (int it = 0; it < kUnits / kThreads; ++it) {
    const int u = int(threadIdx.x) + it * kThreads;
    const int r = u / (D / 8), col = (u % (D / 8)) * 8;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv)
      fp8x8_to_f16_shared<C>(smem_addr((kv ? dv : dk) + r * kStride + col),
                             (kv ? sv8 : sk8) + r * D + col);
  }
}

// q, out: [num_tokens, num_q_heads, D] bf16. Caches: byte pointers to elements of C. scale_log2 =
// scale · log2(e) > 0 (the running max is taken on raw scores). log_hpc = log2(q heads per CTA).
template <int D, DType C>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_kernel(const __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ out,
                   const unsigned char* __restrict__ k_cache,
                   const unsigned char* __restrict__ v_cache,
                   const int32_t* __restrict__ query_start,
                   const int32_t* __restrict__ context_lens,
                   const int32_t* __restrict__ block_tables, int max_blocks_per_seq, int block_size,
                   int num_q_heads, int num_kv_heads, int log_hpc, float scale_log2,
                   float v_scale) {
  using S = Shape<D, C>;
  constexpr bool kF16 = S::kFp8;  // fp8 caches run the mma in f16
  extern __shared__ __align__(16) unsigned char smem[];
  auto stage = [&](int s) { return smem + s * S::kStageBytes; };

  pdl_wait();  // metadata, q and the cache come from earlier kernels of the step
  const PrefillCtaWork work =
      prefill_cta_work(query_start, context_lens, block_tables, max_blocks_per_seq, num_q_heads,
                       num_kv_heads, log_hpc, kCtaRows);
  if (work.tiles_left < 0) return;  // CTA-uniform: this sequence has fewer query tiles
  const int q_begin = work.q_begin, q_len = work.q_len, p0 = work.p0, prefix = work.prefix;
  const int num_keys = work.num_keys, head0 = work.head0, kv_head = work.kv_head;
  const int num_tiles = (num_keys + kKeys - 1) / kKeys;
  const int32_t* table = work.table;
  const PagedBlocks blocks(block_size);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int head = head0 + (warp & ((1 << log_hpc) - 1));
  const int wrow0 = p0 + (warp >> log_hpc) * 16;  // first query row of this warp
  const bool warp_active = wrow0 < q_len;         // warp-uniform
  const int row_lo = wrow0 + g, row_hi = wrow0 + g + 8;
  // Rows past q_len compute on zero q and are never stored; clamping their positions keeps key 0
  // unmasked in every row, so every running max is finite after tile 0.
  const int pos_lo = prefix + min(row_lo, q_len - 1), pos_hi = prefix + min(row_hi, q_len - 1);
  const int warp_first_pos = prefix + wrow0;
  const int warp_last_key = prefix + min(wrow0 + 15, q_len - 1);

  uint32_t qa[D / 16][4];
  {
    auto row_ptr = [&](int r) -> const __nv_bfloat16* {
      return r < q_len ? q + ((int64_t(q_begin) + r) * num_q_heads + head) * D : nullptr;
    };
    load_q_frags<D, kF16>(qa, row_ptr(row_lo), row_ptr(row_hi), c);
  }
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m: raw-score running max

  // ldmatrix row address of this lane for K (16-bit elements from the tile start): matrices
  // (keys +0..7, d +0), (keys +0..7, d +8), (keys +8..15, d +0), (+8, +8).
  const int k_lane = ((lane & 7) + ((lane >> 4) << 3)) * S::kStride + ((lane >> 3) & 1) * 8;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) {
      load_tile<D, C>(stage(s), k_cache, v_cache, table, blocks, num_kv_heads, kv_head, s * kKeys,
                      num_keys);
    }
    cp_async_commit();
  }
  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed
    // All copies of tile t are visible, and every warp is done with tile t − 1: its stage (and
    // the fp8 f16 tiles) may be overwritten.
    __syncthreads();
    {
      const int nt = t + kStages - 1;
      if (nt < num_tiles) {
        load_tile<D, C>(stage(nt % kStages), k_cache, v_cache, table, blocks, num_kv_heads, kv_head,
                        nt * kKeys, num_keys);
      }
      cp_async_commit();  // possibly empty: keeps "all but the newest kStages − 2" = tile t + 1
    }
    const unsigned char* cur = stage(t % kStages);
    const uint16_t* sk;
    const uint16_t* sv;
    if constexpr (S::kFp8) {
      uint16_t* conv = reinterpret_cast<uint16_t*>(smem + S::kStagesBytes);
      convert_tile<D, C>(conv, conv + S::kTileElems, cur, cur + S::kTileBytes);
      __syncthreads();
      sk = conv;
      sv = conv + S::kTileElems;
    } else {
      sk = reinterpret_cast<const uint16_t*>(cur);
      sv = reinterpret_cast<const uint16_t*>(cur + S::kTileBytes);
    }
    const int key0 = t * kKeys;
    if (!warp_active || key0 > warp_last_key) continue;  // warp-uniform; no barrier below

    // S = Q·Kᵀ (raw dot products).
    float s[kNt][4];
#pragma unroll
    for (int j = 0; j < kNt; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int jp = 0; jp < kNt / 2; ++jp) {
        uint32_t b[4];
        ldmatrix_x4(b, sk + k_lane + jp * 16 * S::kStride + kk * 16);
        mma_16816<kF16>(s[2 * jp], qa[kk], b[0], b[1]);
        mma_16816<kF16>(s[2 * jp + 1], qa[kk], b[2], b[3]);
      }
    }
    // Causal mask, only where the tile reaches past the warp's first position (this also masks
    // the zero-filled keys ≥ num_keys, which lie past every row's position).
    if (key0 + kKeys - 1 > warp_first_pos) causal_mask(s, key0, c, pos_lo, pos_hi);
    online_softmax_raw(s, m, l, o, scale_log2);
    pv_accumulate<D, kNt, kF16>(o, s, sv, lane);  // O += P·V, P from the score fragments
  }
  cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight

  if (!warp_active) return;  // after the last barrier
  reduce_row_sums(l);
  const float inv_lo = l[0] > 0.0f ? v_scale / l[0] : 0.0f;
  const float inv_hi = l[1] > 0.0f ? v_scale / l[1] : 0.0f;
  store_rows<D>(out, o, q_begin, num_q_heads, head, row_lo, row_hi, q_len, c, inv_lo, inv_hi);
}

template <int D, DType C>
void launch_prefill(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr size_t kSmem = Shape<D, C>::kSmemBytes;
  auto kernel = prefill_kernel<D, C>;
  allow_dynamic_smem(kernel, kSmem, "paged_attention_prefill");
  const int log_hpc = prefill_log_heads_per_cta(p.num_q_heads, p.num_kv_heads);
  const dim3 grid = prefill_grid(p, log_hpc, kCtaRows);
  constexpr float kLog2e = 1.4426950408889634f;
  launch_pdl("paged_attention_prefill", kernel, grid, dim3(kThreads), kSmem, stream,
             reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<__nv_bfloat16*>(p.out),
             static_cast<const unsigned char*>(p.k_cache),
             static_cast<const unsigned char*>(p.v_cache), p.query_start, p.context_lens,
             p.block_tables, p.max_blocks_per_seq, p.block_size, p.num_q_heads, p.num_kv_heads,
             log_hpc, p.scale * kLog2e, p.v_scale);
}

// fp8 caches are built for head_dim 64 and 128 only (paged_attention() rejects the rest).
template <int D>
void dispatch_prefill(const PagedAttentionParams& p, cudaStream_t stream) {
  switch (p.cache_dtype) {
    case DType::kBF16:
      return launch_prefill<D, DType::kBF16>(p, stream);
    case DType::kF8E4M3:
      if constexpr (D >= 64) return launch_prefill<D, DType::kF8E4M3>(p, stream);
      break;
    case DType::kF8E5M2:
      if constexpr (D >= 64) return launch_prefill<D, DType::kF8E5M2>(p, stream);
      break;
    default:
      break;
  }
  throw InvalidArgument("paged_attention: no prefill kernel for a " +
                        std::string(dtype_name(p.cache_dtype)) + " KV cache with head_dim " +
                        std::to_string(D));
}

}  // namespace

void paged_attention_prefill(const PagedAttentionParams& p, cudaStream_t stream) {
  // The running max is taken on raw scores, which needs a positive scale (softmax scale · k_scale).
  if (!(p.scale > 0.0f)) {
    throw InvalidArgument("paged_attention: prefill needs a positive scale, got " +
                          std::to_string(p.scale));
  }
  if (paged_attention_prefill_wgmma(p, stream)) return;
  switch (p.head_dim) {
    case 16:
      return dispatch_prefill<16>(p, stream);
    case 32:
      return dispatch_prefill<32>(p, stream);
    case 64:
      return dispatch_prefill<64>(p, stream);
    case 128:
      return dispatch_prefill<128>(p, stream);
    default:
      throw InvalidArgument("paged_attention: unsupported head_dim " + std::to_string(p.head_dim));
  }
}

}  // namespace serval::kernels::cuda
