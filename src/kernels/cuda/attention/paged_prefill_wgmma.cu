// Flash-attention prefill over the paged cache on Hopper warpgroup MMA (wgmma), head_dim 128, for
// bf16 and fp8 (e4m3, e5m2) caches; paged_prefill.cu (mma.sync) runs every other case and, with
// SERVAL_PREFILL_MMA_SYNC=1, these too (side-by-side comparisons).
//
// Work split as paged_prefill.cu: a CTA owns 128 (query row, q head) pairs of one sequence, hpc q
// heads of one KV head × 128 / hpc positions; warp w (of 8) takes q head (w mod hpc) and the 16
// positions from 16·(w / hpc). Here the 8 warps form two warpgroups of 64 rows each: a warpgroup
// computes S = Q·Kᵀ as one m64n128 tile (8 wgmma k-steps, Q from registers, K from shared memory)
// and O += P·V as one m64n128 tile (8 k-steps, P from registers, V from shared memory MN-major).
// Both warpgroups share every K/V tile (128 keys); one barrier per tile (fp8: two). The wgmma
// read tiles in the 128-byte swizzled layout of wgmma.cuh: K and V alike,
// [2 dim chunks][128 keys][64 dims].
//   - bf16 caches: cp.async copies straight into that layout, a ring of kStages tiles, the page
//     table looked up per key row.
//   - fp8 caches: cp.async stages the tile dense (128 bytes a key row, two stages); after a
//     barrier every thread converts its part to f16 into one of two swizzled tiles (exact:
//     paged_prefill.cu's rule), and a second barrier publishes it. The MMAs then run in f16 with Q
//     re-encoded from bf16 (saturating at ±65504) and P in f16: paged_prefill.cu's fp8 numerics.
//     k_scale is in the softmax scale, v_scale multiplies the output.
//
// Softmax as paged_prefill.cu (log2 domain, running max on raw scores, causal mask only on tiles
// that reach past the warpgroup's first position); rows past the query length compute on zero q
// with clamped positions and are never stored.
#include <cstdlib>
#include <string>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/attention/mma_fragments.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"
#include "kernels/cuda/misc/wgmma.cuh"

namespace serval::kernels::cuda {
namespace {

using namespace attn;

constexpr int kD = 128;
constexpr int kWarpgroups = 2;
constexpr int kCtaThreads = kWarpgroups * 128;
constexpr int kCtaRows = kWarpgroups * 64;       // (query row, q head) pairs per CTA
constexpr int kKeys = 128;                       // keys per K/V tile
constexpr int kNt = kKeys / 8;                   // score column blocks per thread
constexpr uint32_t kTileBytes = kKeys * kD * 2;  // one K or V tile as the wgmma read it
constexpr uint32_t kStageBytes = 2 * kTileBytes;
constexpr uint32_t kFp8TileBytes = kKeys * kD;  // one K or V tile as staged from an fp8 cache
constexpr uint32_t kFp8StageBytes = 2 * kFp8TileBytes;
// Shared memory: bf16, a kStages-deep K/V ring (3 stages: 193 KB of the 227 KB a CTA may use);
// fp8, two staging stages and two f16 K/V tiles (also 193 KB).
template <int kStages, bool kFp8>
constexpr size_t kSmemBytes = (kFp8 ? 2 * size_t(kFp8StageBytes) + 2 * size_t(kStageBytes)
                                    : kStages * size_t(kStageBytes)) +
                              1024;
static_assert(kTileBytes % 1024 == 0 && kFp8StageBytes % 1024 == 0, "swizzle atoms stay aligned");

// a · b as 64 bits from 32-bit factors: one IMAD.WIDE (the compiler, given int64 operands that
// hold 32-bit values, may emit a full 64 × 64 multiply).
__device__ __forceinline__ int64_t mul_wide(int32_t a, int32_t b) {
  int64_t r;
  asm("mul.wide.s32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
  return r;
}

// A thread's K/V copies of kElemBytes-byte elements: it copies 16-byte chunk column c = tid %
// kChunks of tile rows r0 + kRowStep·i (r0 = tid / kChunks, i = 0..kIters − 1). bf16: into the
// SW128 tile, where those rows share row r0's swizzle; fp8: into a dense staging tile of 128-byte
// rows. The address arithmetic is on the math warps' path (a division per chunk cost this kernel
// 11 %, measured on the H200): per-thread constants, a shift and a mask for power-of-two block
// sizes (chosen once per tile), and one 32 × 32 → 64-bit multiply per chunk (the block's offset;
// the rest fits 32 bits).
template <int kElemBytes>
struct TileCopier {
  static constexpr int kChunks = kD * kElemBytes / 16;  // 16-byte chunks per key row
  static constexpr int kRowStep = kCtaThreads / kChunks;
  static constexpr int kIters = kKeys / kRowStep;
  static constexpr uint32_t kTile = kKeys * kD * kElemBytes;  // bytes of one K (or V) tile
  static_assert(kKeys % kRowStep == 0 && kRowStep % 8 == 0, "rows r0 + kRowStep·i share a swizzle");
  int r0;
  uint32_t dst0;        // shared-memory offset of row r0's chunk in a tile
  int32_t head_off;     // bytes from a cache slot to this KV head's chunk c
  int32_t slot_bytes;   // bytes per cache slot (num_kv_heads · kD · kElemBytes)
  int32_t block_bytes;  // bytes per cache block (block_size · slot_bytes; the launch checks < 2^31)
  PagedBlocks blocks;

  __device__ __forceinline__ TileCopier(int block_size, int num_kv_heads, int kv_head)
      : blocks(block_size) {
    const int c = int(threadIdx.x) % kChunks;
    r0 = int(threadIdx.x) / kChunks;
    // Both layouts put rows 128 bytes apart (SW128: within a 64-dim chunk).
    dst0 = kElemBytes == 2 ? wgmma::sw128_offset(r0, c, kKeys) : uint32_t(r0 * 128 + c * 16);
    head_off = kv_head * kD * kElemBytes + c * 16;
    slot_bytes = num_kv_heads * kD * kElemBytes;
    block_bytes = block_size * slot_bytes;
  }

  // cp.async of keys [key0, key0 + kKeys) of the KV head into the K and V tiles at k_tile,
  // v_tile; keys ≥ num_keys are zero-filled, never read from the cache.
  __device__ __forceinline__ void load(unsigned char* k_tile, unsigned char* v_tile,
                                       const unsigned char* k_cache, const unsigned char* v_cache,
                                       const int32_t* table, int key0, int num_keys) const {
    if (blocks.log2 >= 0) {
      load_rows<true>(k_tile, v_tile, k_cache, v_cache, table, key0, num_keys);
    } else {
      load_rows<false>(k_tile, v_tile, k_cache, v_cache, table, key0, num_keys);
    }
  }

  template <bool kPow2>
  __device__ __forceinline__ void load_rows(unsigned char* k_tile, unsigned char* v_tile,
                                            const unsigned char* k_cache,
                                            const unsigned char* v_cache, const int32_t* table,
                                            int key0, int num_keys) const {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int key = key0 + r0 + it * kRowStep;
      const bool valid = key < num_keys;
      int64_t off = 0;  // bytes
      if (valid) {
        const int block = blocks.block_of<kPow2>(key);
        off = mul_wide(table[block], block_bytes) +
              (blocks.within<kPow2>(key, block) * slot_bytes + head_off);
      }
      const uint32_t dst = dst0 + uint32_t(it * kRowStep * 128);
      cp_async_16(k_tile + dst, k_cache + off, valid);
      cp_async_16(v_tile + dst, v_cache + off, valid);
    }
  }
};

// Converts a staged fp8 K or V tile (dense: key r's 128 bytes at r·128) into the f16 SW128 tile
// the wgmma read. Thread t converts 8-element units of chunk column t % 16, rows t / 16 + 16·i:
// one 8-byte shared load and one 16-byte store each (rows 16 apart share a swizzle).
template <DType C>
__device__ __forceinline__ void convert_fp8_tile(unsigned char* dst, const unsigned char* src) {
  constexpr int kRowStep = kCtaThreads / 16;
  const int c = int(threadIdx.x) % 16, r0 = int(threadIdx.x) / 16;
  const unsigned char* from = src + r0 * 128 + c * 8;
  const uint32_t to = smem_addr(dst) + wgmma::sw128_offset(r0, c, kKeys);
#pragma unroll
  for (int i = 0; i < kKeys / kRowStep; ++i)
    fp8x8_to_f16_shared<C>(to + i * kRowStep * 128, from + i * kRowStep * 128);
}

// q, out: [num_tokens, num_q_heads, 128] bf16; caches of element type C. scale_log2 = scale ·
// log2(e) > 0; v_scale multiplies the output (fp8 caches; bf16 launches pass 1).
// log_hpc = log2(q heads per CTA). kStages = 2 (bf16 only): every wgmma group is waited for in
// its own iteration. kStages = 3 (and every fp8 kernel): O += P·V of tile t is waited for only
// after S of tile t + 1 is issued, so it overlaps the next barrier and loads (its V tile is
// rewritten two tiles later). The next tile's copies are issued after S (their page-table reads
// and address arithmetic, ~200 instructions a thread, overlap the tensor cores).
template <DType C, int kStages>
__global__ void __launch_bounds__(kCtaThreads, 1)
    prefill_wgmma_kernel(const __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ out,
                         const unsigned char* __restrict__ k_cache,
                         const unsigned char* __restrict__ v_cache,
                         const int32_t* __restrict__ query_start,
                         const int32_t* __restrict__ context_lens,
                         const int32_t* __restrict__ block_tables, int max_blocks_per_seq,
                         int block_size, int num_q_heads, int num_kv_heads, int log_hpc,
                         float scale_log2, float v_scale) {
  constexpr bool kFp8 = C != DType::kBF16;
  constexpr bool kDeferPv = kFp8 || kStages == 3;  // P·V of tile t waited for in tile t + 1
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzle atoms need 1024-byte alignment: the launch reserves the slack.
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  // The K tile (V follows at + kTileBytes) the wgmma of tile t read; fp8: after the two staging
  // stages, which the copies fill (copy_slot).
  auto mma_slot = [&](int t) {
    return kFp8 ? smem + 2 * kFp8StageBytes + (t & 1) * kStageBytes
                : smem + (t % kStages) * kStageBytes;
  };
  auto copy_slot = [&](int t) { return kFp8 ? smem + (t & 1) * kFp8StageBytes : mma_slot(t); };

  pdl_wait();  // metadata, q and the cache come from earlier kernels of the step
  const PrefillCtaWork work =
      prefill_cta_work(query_start, context_lens, block_tables, max_blocks_per_seq, num_q_heads,
                       num_kv_heads, log_hpc, kCtaRows);
  if (work.tiles_left < 0) return;  // CTA-uniform: this sequence has fewer query tiles
  const int q_begin = work.q_begin, q_len = work.q_len, p0 = work.p0, prefix = work.prefix;
  const int num_keys = work.num_keys, head0 = work.head0, kv_head = work.kv_head;
  const int num_tiles = (num_keys + kKeys - 1) / kKeys;
  const int32_t* table = work.table;
  const int hpc_mask = (1 << log_hpc) - 1;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int wg = warp >> 2;
  // Query row of warp gw's 16 rows, as paged_prefill.cu assigns them.
  auto warp_row0 = [&](int gw) { return p0 + (gw >> log_hpc) * 16; };
  const int head = head0 + (warp & hpc_mask);
  const int row_lo = warp_row0(warp) + g, row_hi = row_lo + 8;
  const int pos_lo = prefix + min(row_lo, q_len - 1), pos_hi = prefix + min(row_hi, q_len - 1);
  // Warpgroup-uniform bounds (wgmma runs on the whole warpgroup).
  const int wg_row_first = warp_row0(4 * wg), wg_row_last = warp_row0(4 * wg + 3) + 15;
  const bool wg_active = wg_row_first < q_len;
  const int wg_first_pos = prefix + wg_row_first;
  const int wg_last_key = prefix + min(wg_row_last, q_len - 1);

  // Q as this thread's A fragments of S = Q·Kᵀ (RS wgmma: 1.5 % faster than reading Q from shared
  // memory at every tile, measured on the H200): k-step kk holds rows row_lo (0, 2) and row_hi
  // (1, 3) at dims 16·kk + 2c (0, 1) and + 8 (2, 3); zeros past q_len; f16 for fp8 caches.
  uint32_t qa[kD / 16][4];
  {
    auto enc = [](uint32_t v) { return kFp8 ? bf16x2_to_f16x2(v) : v; };
    auto q_row = [&](int row) {
      return reinterpret_cast<const uint32_t*>(q + ((int64_t(q_begin) + row) * num_q_heads + head) *
                                                       kD) +
             c;
    };
    const uint32_t* lo = q_row(min(row_lo, q_len - 1));
    const uint32_t* hi = q_row(min(row_hi, q_len - 1));
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      qa[kk][0] = row_lo < q_len ? enc(lo[8 * kk]) : 0u;
      qa[kk][1] = row_hi < q_len ? enc(hi[8 * kk]) : 0u;
      qa[kk][2] = row_lo < q_len ? enc(lo[8 * kk + 4]) : 0u;
      qa[kk][3] = row_hi < q_len ? enc(hi[8 * kk + 4]) : 0u;
    }
  }

  float o[kD / 8][4], s[kNt][4];  // wgmma accumulators: o[n][·] dims 8n.., s[j][·] keys 8j..
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
  for (int j = 0; j < kNt; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m: raw-score running max
  uint32_t pa[kKeys / 16][4] = {};  // P of the current tile as wgmma A fragments

  const TileCopier<kFp8 ? 1 : 2> copier(block_size, num_kv_heads, kv_head);
  auto load = [&](int t) {
    unsigned char* slot = copy_slot(t);
    copier.load(slot, slot + copier.kTile, k_cache, v_cache, table, t * kKeys, num_keys);
  };
  // S = Q·Kᵀ of the K tile at k_base: k-step kk covers dims 16·kk.. (chunk kk / 4, +32 bytes per
  // step inside it). Issued, not committed.
  auto issue_scores = [&](uint32_t k_base) {
    const uint64_t b0 = wgmma::sw128_desc(k_base, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t b = wgmma::desc_advance(b0, (kk >> 2) * kKeys * 128 + (kk & 3) * 32);
      wgmma::wgmma_m64n128k16_rs<0, kFp8>(s, qa[kk], b, kk > 0);
    }
  };
  // P (the probabilities in s) as the A fragments of the 8 k-steps of 16 keys.
  auto pack_probs = [&] {
#pragma unroll
    for (int kq = 0; kq < kKeys / 16; ++kq) {
      pa[kq][0] = pack_pair<kFp8>(s[2 * kq][0], s[2 * kq][1]);
      pa[kq][1] = pack_pair<kFp8>(s[2 * kq][2], s[2 * kq][3]);
      pa[kq][2] = pack_pair<kFp8>(s[2 * kq + 1][0], s[2 * kq + 1][1]);
      pa[kq][3] = pack_pair<kFp8>(s[2 * kq + 1][2], s[2 * kq + 1][3]);
    }
  };
  // O += P·V of the V tile at v_base: k-step kq starts at key row 16·kq; LBO steps to its second
  // 64-dim chunk. Issued, not committed.
  auto issue_pv = [&](uint32_t v_base) {
    const uint64_t b0 = wgmma::sw128_desc(v_base, kKeys * 128, 1024);
#pragma unroll
    for (int kq = 0; kq < kKeys / 16; ++kq)
      wgmma::wgmma_m64n128k16_rs_bt<kFp8>(o, pa[kq], wgmma::desc_advance(b0, kq * 16 * 128));
  };

  load(0);
  cp_async_commit();
  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<0>();  // this thread's copies of tile t have landed
    if constexpr (kFp8) {
      __syncthreads();  // everyone's; the f16 tile written next was last read by tile t − 2's
                        // wgmma, which every warpgroup has waited for in tile t − 1
      unsigned char* k8 = copy_slot(t);
      unsigned char* k16 = mma_slot(t);
      convert_fp8_tile<C>(k16, k8);
      convert_fp8_tile<C>(k16 + kTileBytes, k8 + kFp8TileBytes);
    }
    wgmma::fence_proxy_async();  // this thread's tile writes are visible to wgmma
    __syncthreads();  // everyone's; the slot refilled next was last read kStages − 1 tiles ago
                      // (fp8: converted last tile), and every warpgroup has waited for those
                      // wgmma since
    auto load_next = [&] {
      if (t + 1 < num_tiles) load(t + 1);
      cp_async_commit();
    };
    const int key0 = t * kKeys;
    if (!wg_active || key0 > wg_last_key) {  // warpgroup-uniform; no barrier below
      load_next();
      wgmma::wait<0>();  // nothing of this warpgroup stays in flight
      continue;
    }
    const uint32_t k_base = smem_addr(mma_slot(t)), v_base = k_base + kTileBytes;

    wgmma::fence();
    issue_scores(k_base);
    wgmma::commit();
    load_next();       // while the tensor cores compute S
    wgmma::wait<0>();  // S, and (kDeferPv) the previous tile's P·V
    wgmma::fence_operand(s);
    if constexpr (kDeferPv) {
      wgmma::fence_operand(o);
      wgmma::fence_operand(pa);
    }
    if (key0 + kKeys - 1 > wg_first_pos) causal_mask(s, key0, c, pos_lo, pos_hi);
    online_softmax_raw(s, m, l, o, scale_log2);
    pack_probs();
    wgmma::fence();
    issue_pv(v_base);
    wgmma::commit();
    if constexpr (!kDeferPv) {
      wgmma::wait<0>();
      wgmma::fence_operand(o);
      wgmma::fence_operand(pa);
    }
  }
  wgmma::wait<0>();
  wgmma::fence_operand(o);
  cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight

  reduce_row_sums(l);
  float inv_lo = l[0] > 0.0f ? 1.0f / l[0] : 0.0f;
  float inv_hi = l[1] > 0.0f ? 1.0f / l[1] : 0.0f;
  if constexpr (kFp8) {
    inv_lo *= v_scale;
    inv_hi *= v_scale;
  }
  store_rows<kD>(out, o, q_begin, num_q_heads, head, row_lo, row_hi, q_len, c, inv_lo, inv_hi);
}

}  // namespace

namespace {

template <DType C, int kStages>
void launch(const PagedAttentionParams& p, float v_scale, cudaStream_t stream) {
  constexpr bool kFp8 = C != DType::kBF16;
  auto kernel = prefill_wgmma_kernel<C, kStages>;
  constexpr size_t smem = kSmemBytes<kStages, kFp8>;
  allow_dynamic_smem(kernel, smem, "paged_attention_prefill_wgmma");
  const int log_hpc = prefill_log_heads_per_cta(p.num_q_heads, p.num_kv_heads);
  const dim3 grid = prefill_grid(p, log_hpc, kCtaRows);
  constexpr float kLog2e = 1.4426950408889634f;
  launch_pdl("paged_attention_prefill_wgmma", kernel, grid, dim3(kCtaThreads), smem, stream,
             reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<__nv_bfloat16*>(p.out),
             static_cast<const unsigned char*>(p.k_cache),
             static_cast<const unsigned char*>(p.v_cache), p.query_start, p.context_lens,
             p.block_tables, p.max_blocks_per_seq, p.block_size, p.num_q_heads, p.num_kv_heads,
             log_hpc, p.scale * kLog2e, v_scale);
}

}  // namespace

bool paged_attention_prefill_wgmma(const PagedAttentionParams& p, cudaStream_t stream) {
  static const bool off = std::getenv("SERVAL_PREFILL_MMA_SYNC") != nullptr;
  if (off || p.head_dim != kD || !(p.scale > 0.0f)) return false;
  // TileCopier's 32-bit byte offsets inside a cache block.
  if (int64_t(p.block_size) * p.num_kv_heads * kD * dtype_bits(p.cache_dtype) / 8 >=
      (int64_t(1) << 31))
    return false;
  switch (p.cache_dtype) {
    case DType::kBF16: {
      if (p.v_scale != 1.0f) return false;
      // SERVAL_PREFILL_WGMMA_STAGES=2: the two-stage kernel (side-by-side comparisons).
      static const bool two = [] {
        const char* env = std::getenv("SERVAL_PREFILL_WGMMA_STAGES");
        return env != nullptr && std::string(env) == "2";
      }();
      two ? launch<DType::kBF16, 2>(p, 1.0f, stream) : launch<DType::kBF16, 3>(p, 1.0f, stream);
      return true;
    }
    case DType::kF8E4M3:
      launch<DType::kF8E4M3, 3>(p, p.v_scale, stream);
      return true;
    case DType::kF8E5M2:
      launch<DType::kF8E5M2, 3>(p, p.v_scale, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace serval::kernels::cuda
