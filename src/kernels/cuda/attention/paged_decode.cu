// Split-KV decode attention (one query row per sequence). One CTA per (split, kv head, sequence)
// serves up to 16 q heads of the GQA group as the 16 mma rows, so each K/V tile is loaded once
// for the whole group. The 4 warps take 16 keys each of every 64-key tile with their own online
// softmax state and are merged through shared memory at the end. A sequence uses the first
// decode_partition(...).active splits of the grid (attention_launch.h); the others exit at once.
// With one active split the CTA writes the output; with several each writes a normalized partial
// (o, log2-sum-exp) and the last to finish merges them (decode_merge.cuh; above 16 active splits
// in two levels, groups of 8 then the groups: arrive_and_merge), or merge_kernel does for very
// large grids. Both kernels are launched with programmatic dependent launch.
//
// Latency at small batch is a chain of dependent loads, so the kernel starts three independent
// ones together right after pdl_wait(): the context length, q (row = sequence: decode has one
// query row per sequence) and the block-table entries of its first kStages tiles, guessed for a
// split of min_tiles tiles (decode_min_tiles: exact whenever the sequence's splits get that floor,
// as short and medium contexts do; otherwise re-read once the context and the split choice are
// known). Then kStages shared-memory stages of [K tile | V tile] are filled by cp.async; the
// block-table entries of the next tile to issue are loaded into registers one iteration before
// their slot arithmetic (from L1: the CTA's later entries are prefetched there), so no issue waits
// on a global load.
//
// paged_attention_rope runs the variant kRope, which also does qk_norm_rope_kv's work (one kernel
// less per layer and step): q and the new key and value come unprocessed from the fused QKV rows.
// As no running kernel then writes the cache, the CTA does everything up to the first tiles' copies
// (and the RoPE angles) before pdl_wait, and only the QKV rows after it.
//
// fp8 caches never go through an f16 tile: the mma fragments are built in registers from the
// staged fp8 bytes (rows padded to D + 16 bytes, conflict-free). K: one 4-byte shared load gives
// dims 4c..4c+3 of a key, converted by two cvt.rn.f16x2.e4m3x2 (or byte moves for e5m2) into the
// b0/b1 registers of one 16-dim k-step; q is loaded with the same dim permutation, so Q·Kᵀ is
// unchanged. V: ldmatrix.trans on the fp8 rows read as 16-bit pairs gives, per register, keys
// (2c, 2c+1) of dims (2g, 2g+1); one byte permute per dim makes an e4m3x2 key pair, i.e. a B
// register of an n-tile holding the even (or odd) dims of a 16-dim block. The accumulator
// columns are therefore permuted, which the epilogue undoes (o_dim()).
//
// The kernel's parts: decode_shape.cuh (shared-memory stages, q staging), decode_kv_copy.cuh (the
// tiles' cp.async copies), decode_fp8_mma.cuh (fp8 fragments), decode_rope_io.cuh (the kRope
// variant's rows), decode_merge.cuh (the split merge); this file the kernel, the fused merge's
// arrivals and the launch.

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/env.h"
#include "base/error.h"
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/attention/decode_fp8_mma.cuh"
#include "kernels/cuda/attention/decode_kv_copy.cuh"
#include "kernels/cuda/attention/decode_merge.cuh"
#include "kernels/cuda/attention/decode_rope_io.cuh"
#include "kernels/cuda/attention/decode_shape.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"

namespace serval::kernels::cuda {
namespace {

using namespace attn;
using namespace decode;
static_assert(kDecodeTileKeys == kTileKeys);

// The merge without a second kernel (fused_merge): the last active split CTA of each (sequence,
// head group) to finish combines the group's partials. Up to kFlatMergeMaxSplits active splits it
// merges them all at once. With more, the merge is a two-level tree, so that no CTA reads more
// than kMergeGroup partials (one L2 round trip of merge_rows' loads instead of up to eight): the
// last CTA of each group of kMergeGroup consecutive splits merges the group into the group's first
// slot, and the last of those group CTAs merges the group partials. Arrival counters live in
// device memory that is zero at module load; each last CTA resets its counter, so they are zero
// again for the next launch, which touches them only after pdl_wait (after this launch
// completed). Grids with more (sequence, head group) pairs use merge_kernel.
constexpr int kMaxMergeCounters = 8192;
constexpr int kMergeGroup = attn::kMergeBatch;
constexpr int kMergeGroups = kDecodeMaxSplits / kMergeGroup;
constexpr int kFlatMergeMaxSplits = 2 * kMergeGroup;
__device__ unsigned int g_decode_arrivals[kMaxMergeCounters];
__device__ unsigned int g_decode_group_arrivals[kMaxMergeCounters * kMergeGroups];

// Counts this CTA's arrival among the `active` splits; the last arrivals merge (above). Called by
// all threads after the CTA's partials are written. scratch: shared memory of kMergeScratchFloats
// floats, free from here on. By all kCtaThreads threads of the CTA.
template <int D, int kCtaThreads>
__device__ __forceinline__ void arrive_and_merge(float* o_part, float* lse_part, __nv_bfloat16* out,
                                                 int seq, int head0, int num_rows, int num_q_heads,
                                                 int num_splits, int active, float v_scale,
                                                 float* scratch) {
  // No static shared memory here (a bool would put the decode kernel's dynamic stages off their
  // 128-byte alignment): the arrival's outcome is broadcast by __syncthreads_or.
  const int counter = blockIdx.z * gridDim.y + blockIdx.y;
  const bool tree = active > kFlatMergeMaxSplits;
  // Every thread's partial stores before thread 0's arrival, which releases them (and acquires
  // the others' for the last CTA: arrive_acq_rel; __syncthreads_or passes them on to its threads).
  __syncthreads();
  if (tree) {
    const int group = blockIdx.x / kMergeGroup, first = group * kMergeGroup;
    const int size = min(kMergeGroup, active - first);
    if (size > 1) {
      unsigned int* arrivals = &g_decode_group_arrivals[counter * kMergeGroups + group];
      const bool last =
          __syncthreads_or(threadIdx.x == 0 && arrive_acq_rel(arrivals) == unsigned(size - 1));
      if (!last) return;
      if (threadIdx.x == 0) *arrivals = 0;
      merge_rows<D, kCtaThreads>(o_part, lse_part, seq, head0, num_rows, num_q_heads, num_splits,
                                 first, 1, size, scratch,
                                 MergeOut::to_slot(o_part, lse_part, first));
      __syncthreads();  // the group partial's stores before thread 0's arrival below
    }
  }
  const int expected = tree ? (active + kMergeGroup - 1) / kMergeGroup : active;
  const bool last = __syncthreads_or(
      threadIdx.x == 0 && arrive_acq_rel(&g_decode_arrivals[counter]) == unsigned(expected - 1));
  if (!last) return;
  if (threadIdx.x == 0) g_decode_arrivals[counter] = 0;
  merge_rows<D, kCtaThreads>(o_part, lse_part, seq, head0, num_rows, num_q_heads, num_splits, 0,
                             tree ? kMergeGroup : 1, expected, scratch,
                             MergeOut::to_output(out, v_scale));
}

// kRope (paged_attention_rope): q and the step's new key and value come unprocessed in the fused
// QKV rows of rope_args; the kernel does qk_norm_rope_kv's work for them (q unused). Then no
// running kernel writes what the CTA reads before pdl_wait, so everything but those rows comes
// before it: the metadata (copied in before the step's first kernel), the split, the RoPE angles,
// the first kStages − 1 tiles (the cache rows of earlier steps). The new key's row is not copied
// (key ctx − 1 is left out of the copies, which zero-fill it): the CTA holding it computes it and
// puts it into its stage when that tile has landed. W: the CTA's warps (DecodeShape).
template <int D, DType C, bool kRope, int W>
__global__ void __launch_bounds__(DecodeShape<D, C, W>::kCtaThreads,
                                  DecodeShape<D, C, W>::kCtasPerSm)
    decode_kernel(const __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ out,
                  const unsigned char* k_cache, const unsigned char* v_cache,
                  const int32_t* __restrict__ context_lens,
                  const int32_t* __restrict__ block_tables, int max_blocks_per_seq, int block_size,
                  int num_q_heads, int num_kv_heads, float scale_log2, float v_scale,
                  int num_splits, int slots, int min_tiles, bool fused_merge,
                  float* __restrict__ o_part, float* __restrict__ lse_part,
                  const __grid_constant__ DecodeRopeArgs rope_args) {
  using S = DecodeShape<D, C, W>;
  constexpr bool kFp8 = S::kFp8;  // fp8 caches run the mma in f16
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto stage = [&](int s) { return smem_raw + s * 2 * S::kTileBytes; };
  __shared__ float warp_m[W][16], warp_l[W][16];
  // Without kRope: q, the metadata and the KV cache come from earlier kernels of the step.
  if constexpr (!kRope) pdl_wait();

  const int seq = blockIdx.z, split = blockIdx.x;
  const int group = num_q_heads / num_kv_heads;
  const int sub_groups = (group + 15) / 16;
  const int kv_head = blockIdx.y / sub_groups;
  const int head0 = kv_head * group + (blockIdx.y % sub_groups) * 16;  // q head of mma row 0
  const int num_rows = min(16, kv_head * group + group - head0);
  const int32_t* table = block_tables + int64_t(seq) * max_blocks_per_seq;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int copy_row = threadIdx.x / S::kChunks, copy_chunk = threadIdx.x % S::kChunks;
  const PagedBlocks blocks(block_size);
  using RL = rope::Lanes<D>;
  float qw1[RL::kPairs], qw2[RL::kPairs], kw1[RL::kPairs], kw2[RL::kPairs], freq[RL::kPairs];
  if constexpr (kRope) {  // weights
    const auto* q_norm = reinterpret_cast<const __nv_bfloat16*>(rope_args.q_norm);
    const auto* k_norm = reinterpret_cast<const __nv_bfloat16*>(rope_args.k_norm);
    rope::load_norm_weights<D>(q_norm, lane, true, qw1, qw2);
    rope::load_norm_weights<D>(k_norm, lane, true, kw1, kw2);
    rope::load_inv_freq<D>(rope_args.inv_freq, lane, true, freq);
  }

  // Independent loads in flight together: the context length, the table entries of the first
  // kStages tiles if this split starts at min_tiles tiles per split, and q (without kRope) or the
  // RoPE position and the new key's slot (kRope; issued later, they were one more round trip before
  // pdl_wait: 13 % of the kernel's stall samples at Qwen3-30B batch 8).
  const int ctx = context_lens[seq];
  [[maybe_unused]] int position = 0, new_key_slot = -1;
  if constexpr (kRope) {
    position = rope_args.positions[seq];
    new_key_slot = rope_args.slot_mapping[seq];
  }
  const int guess_begin = split * min_tiles * S::kTileKeys;
  int entry[S::kStages][S::kRowsPerThread];
#pragma unroll
  for (int s = 0; s < S::kStages; ++s)
    fetch_entries<S>(entry[s], table, blocks, max_blocks_per_seq, guess_begin + s * S::kTileKeys,
                     copy_row);
  using Q = QStage<D, kFp8, S::kCtaThreads>;
  uint32_t q_pairs[Q::kPerThread];
  if constexpr (!kRope) Q::load(q_pairs, q + (int64_t(seq) * num_q_heads + head0) * D, num_rows);

  const DecodePartition part = decode_partition<S::kTileKeys>(
      ctx, num_splits, num_rows, gridDim.y * gridDim.z, slots, min_tiles);
  if (split >= part.active) {         // no key for this split (CTA-uniform)
    if constexpr (kRope) pdl_wait();  // launch_pdl's contract: no grid completes before waiting
    return;
  }
  const int key_begin = split * part.chunk_keys, key_end = min(ctx, key_begin + part.chunk_keys);
  if (key_begin != guess_begin) {  // longer context: re-read (CTA-uniform)
#pragma unroll
    for (int s = 0; s < S::kStages; ++s)
      fetch_entries<S>(entry[s], table, blocks, max_blocks_per_seq, key_begin + s * S::kTileKeys,
                       copy_row);
  }
  const int num_tiles = (key_end - key_begin + S::kTileKeys - 1) / S::kTileKeys;
  // Tiles past the first kStages read their entries in the loop: from L1 after this.
  if (num_tiles > S::kStages)
    prefetch_table_l1<S::kCtaThreads>(table, blocks.block(key_begin + S::kStages * S::kTileKeys),
                                      blocks.block(key_end - 1));

  // q goes through the last stage, which the loop fills first at its first iteration.
  static_assert(Q::kBytes <= 2 * S::kTileBytes);
  uint32_t* q_staged = reinterpret_cast<uint32_t*>(stage(S::kStages - 1));
  if constexpr (!kRope) Q::store(q_staged, q_pairs);
  // kRope: key ctx − 1 is computed, not copied (kernel comment above).
  const int copy_end = kRope ? min(key_end, ctx - 1) : key_end;

  const int64_t head_bytes = int64_t(kv_head) * D * S::kElemBytes + copy_chunk * 16;
  const KvSource kv_src{k_cache + head_bytes, v_cache + head_bytes,
                        num_kv_heads * D * S::kElemBytes};
  // Prologue: tiles 0 .. kStages-2 in flight, the entries of tile kStages-1 loaded.
  int slot[S::kRowsPerThread];
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < num_tiles) {
      entries_to_slots<S>(slot, entry[s], blocks, key_begin + s * S::kTileKeys, copy_end, copy_row);
      issue_tile<S>(stage(s), kv_src, slot, copy_row, copy_chunk);
    }
    cp_async_commit();
  }
  // kRope: q, and the new key and value in the CTA holding key ctx − 1 (the last active split).
  const int new_tile = kRope && key_end == ctx ? (ctx - 1 - key_begin) / S::kTileKeys : -1;
  uint32_t new_row[RL::kPairs];  // warp 0: the new key, warp 1: its value (new_tile ≥ 0)
  if constexpr (kRope) {
    // The angles and the slot are metadata: before pdl_wait.
    float cos_a[RL::kPairs], sin_a[RL::kPairs];
    rope::angles<D>(float(position), freq, cos_a, sin_a);
    const int new_slot = new_tile >= 0 ? new_key_slot : -1;
    pdl_wait();  // the fused QKV rows come from the kernel before
    const __nv_bfloat16* qkv_row = reinterpret_cast<const __nv_bfloat16*>(rope_args.qkv) +
                                   int64_t(seq) * (num_q_heads + 2 * num_kv_heads) * D;
    // Every raw row of the warp requested before any is used: one round trip after the wait,
    // also in the CTA holding the new key (its key's loads, then q's, were two).
    const bool new_row_warp = new_tile >= 0 && warp < 2;  // warp-uniform
    float nx1[RL::kPairs] = {}, nx2[RL::kPairs] = {};
    if (new_row_warp)
      load_new_row<D>(nx1, nx2, qkv_row, num_q_heads, num_kv_heads, kv_head, warp, lane);
    float qx1[kRopeQRowsPerWarp<W>][RL::kPairs], qx2[kRopeQRowsPerWarp<W>][RL::kPairs];
    load_rope_q<D, W>(qx1, qx2, qkv_row + head0 * D, num_rows, warp, lane);
    if (new_row_warp)
      rope_new_row<D, C>(new_row, nx1, nx2, rope_args, new_slot, blockIdx.y % sub_groups == 0,
                         num_kv_heads, kv_head, warp, lane, kw1, kw2, cos_a, sin_a);
    stage_rope_q<D, kFp8, W>(q_staged, qx1, qx2, rope_args, num_rows, warp, lane, qw1, qw2, cos_a,
                             sin_a);
  }
  // The entries of the next tile to issue: loaded one iteration before the slot arithmetic that
  // uses them, so that their latency hides behind a tile's compute.
  int next[S::kRowsPerThread];
#pragma unroll
  for (int i = 0; i < S::kRowsPerThread; ++i) next[i] = entry[S::kStages - 1][i];

  // Every CTA of the grid is resident once the last wave starts: from here the next kernel (the
  // merge, or the layer's next kernel) may be scheduled; its pdl_wait() still waits for this
  // whole grid to finish.
  pdl_launch_dependents();

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  uint32_t qa[D / 16][4];
  __syncthreads();  // q staged
  Q::read(qa, q_staged, lane);
  __syncthreads();  // every warp holds its fragments before the loop refills the last stage

  for (int t = 0; t < num_tiles; ++t) {
    // Tile t + kStages - 1 goes into the stage freed at the end of iteration t - 1.
    const int ahead = t + S::kStages - 1;
    if (ahead < num_tiles) {
      entries_to_slots<S>(slot, next, blocks, key_begin + ahead * S::kTileKeys, copy_end, copy_row);
      issue_tile<S>(stage(ahead % S::kStages), kv_src, slot, copy_row, copy_chunk);
      if (ahead + 1 < num_tiles)  // used next iteration: its latency hides behind this one
        fetch_entries<S>(next, table, blocks, max_blocks_per_seq,
                         key_begin + (ahead + 1) * S::kTileKeys, copy_row);
    }
    cp_async_commit();
    cp_async_wait<S::kStages - 1>();
    __syncthreads();
    if constexpr (kRope) {
      if (t == new_tile) {  // the new key's tile has landed (its row zero-filled): put the row in
        if (warp < 2)
          rope::store_head<D, C>(stage(t % S::kStages) + (warp == 1 ? S::kTileBytes : 0) +
                                     (ctx - 1 - key_begin - t * S::kTileKeys) * S::kRowBytes,
                                 lane, new_row);
        __syncthreads();
      }
    }
    const int key0 = key_begin + t * S::kTileKeys + warp * 16;  // this warp's 16 keys
    if (key0 < key_end) {                                       // warp-uniform
      const unsigned char* sk = stage(t % S::kStages) + warp * 16 * S::kRowBytes;
      const unsigned char* sv = sk + S::kTileBytes;
      float s[2][4];
      if constexpr (kFp8) {
        qk_scores_fp8<D, C>(s, qa, sk, g, c);
      } else {
        qk_scores<D, 2, false>(s, qa, reinterpret_cast<const uint16_t*>(sk), g, c);
      }
      if (key0 + 16 > key_end) mask_keys(s, key0, key_end, c);  // warp-uniform: the last keys
      online_softmax_lazy<2, D / 8>(s, m, l, o, scale_log2);
      if constexpr (kFp8) {
        pv_accumulate_fp8<D, C>(o, s, sv, lane);
      } else {
        pv_accumulate<D, 2, false>(o, s, reinterpret_cast<const uint16_t*>(sv), lane);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  reduce_row_sums(l);

  // Merge the 4 warps: unnormalized o in the (now idle) KV shared memory, [warp][16][kOStride]
  // fp32, rows < num_rows only (the others are padding of the mma). (All cp.async groups are
  // complete and every warp passed the loop's last barrier.)
  float* so = reinterpret_cast<float*>(smem_raw);
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // rows g, g + 8
    if (g + 8 * h >= num_rows) continue;
    float* row = so + (warp * 16 + g + 8 * h) * S::kOStride;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      if constexpr (kFp8) {
        row[o_dim<true>(n, 2 * h, c)] = o[n][2 * h];
        row[o_dim<true>(n, 2 * h + 1, c)] = o[n][2 * h + 1];
      } else {  // dims 2c, 2c + 1 of n-tile n
        *reinterpret_cast<float2*>(row + o_dim<false>(n, 0, c)) =
            make_float2(o[n][2 * h], o[n][2 * h + 1]);
      }
    }
  }
  if (c == 0) {
    warp_m[warp][g] = m[0];
    warp_m[warp][g + 8] = m[1];
    warp_l[warp][g] = l[0];
    warp_l[warp][g + 8] = l[1];
  }
  __syncthreads();
  const bool single = part.active == 1;
  const int64_t part_row0 = (int64_t(seq) * num_q_heads + head0) * num_splits + split;
  // Per row: each warp's weight exp2(m_w − max) / sum (0 for a warp that saw no key; v_scale
  // folded in when this CTA writes the output), and the split's log2-sum-exp.
  if (threadIdx.x < num_rows) {
    const int r = threadIdx.x;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, warp_m[w][r]);
    float f[W], sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      f[w] = warp_m[w][r] == -INFINITY ? 0.0f : exp2f(warp_m[w][r] - mx);
      sum += warp_l[w][r] * f[w];
    }
    const float norm = (single ? v_scale : 1.0f) / sum;
#pragma unroll
    for (int w = 0; w < W; ++w) warp_l[w][r] = f[w] * norm;  // m and l are read no more
    if (!single) lse_part[part_row0 + int64_t(r) * num_splits] = mx + __log2f(sum);
  }
  __syncthreads();
  // Two dims per thread and step (bf16x2 / float2 stores; out and o_part rows are 4- / 8-byte
  // aligned: paged_attention's checks and the 16-byte aligned workspace).
  for (int i = threadIdx.x; i < num_rows * D / 2; i += S::kCtaThreads) {
    const int r = i / (D / 2), d = 2 * (i % (D / 2));
    float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float* src = so + (w * 16 + r) * S::kOStride + d;
      acc0 += src[0] * warp_l[w][r];
      acc1 += src[1] * warp_l[w][r];
    }
    if (single) {
      *reinterpret_cast<__nv_bfloat162*>(out + (int64_t(seq) * num_q_heads + head0 + r) * D + d) =
          __floats2bfloat162_rn(acc0, acc1);
    } else {
      *reinterpret_cast<float2*>(o_part + (part_row0 + int64_t(r) * num_splits) * D + d) =
          make_float2(acc0, acc1);
    }
  }
  if (!single && fused_merge)  // (its barriers also end every read of `so` before the merge)
    arrive_and_merge<D, S::kCtaThreads>(o_part, lse_part, out, seq, head0, num_rows, num_q_heads,
                                        num_splits, part.active, v_scale,
                                        reinterpret_cast<float*>(smem_raw));
}

// The merge for grids beyond kMaxMergeCounters (sequence, head group) pairs: one CTA of kThreads
// per pair, grid (Hkv · sub-groups, num_seqs) like decode_kernel's y and z. Sequences with at most
// one active split were written by decode_kernel.
template <int D>
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                 const int32_t* __restrict__ context_lens, __nv_bfloat16* __restrict__ out,
                 int num_q_heads, int num_kv_heads, int num_splits, int slots, int min_tiles,
                 float v_scale) {
  __shared__ float scratch[kMergeScratchFloats];
  pdl_wait();  // the partials of decode_kernel
  pdl_launch_dependents();
  const int seq = blockIdx.y;
  const int group = num_q_heads / num_kv_heads;
  const int sub_groups = (group + 15) / 16;
  const int kv_head = blockIdx.x / sub_groups;
  const int head0 = kv_head * group + (blockIdx.x % sub_groups) * 16;
  const int num_rows = min(16, kv_head * group + group - head0);
  const int active = decode_partition(context_lens[seq], num_splits, num_rows,
                                      gridDim.x * gridDim.y, slots, min_tiles)
                         .active;
  if (active <= 1) return;
  merge_rows<D, kThreads>(o_part, lse_part, seq, head0, num_rows, num_q_heads, num_splits, 0, 1,
                          active, scratch, MergeOut::to_output(out, v_scale));
}

// The fewest 64-key tiles per active split: kStages, the tiles a CTA requests in its prologue.
// With RoPE inside (paged_attention_rope) the prologue runs before pdl_wait, behind the kernel
// before, so a split of up to kStages tiles streams nothing after it, and fewer splits write fewer
// partials for a shorter merge (Qwen3-30B NVFP4 fp8 b8 on the H200: TPOT 4.47-4.48 ms vs
// 4.51-4.53 with the cost model's 2-tile splits; bench/RESULTS.md). The two-kernel path takes the
// same floor, so both split alike and give the same bits. SERVAL_DECODE_MIN_TILES=N sets the
// floor instead (1: the cost model's choice alone), for A/B.
int decode_min_tiles(int stages) {
  static const int forced = env_int("SERVAL_DECODE_MIN_TILES", 1, 1 << 20, 0);
  return forced > 0 ? forced : stages;
}

// The wide CTA (kWideWarps warps, 128-key tiles, one per SM) for small grids: when every
// (sequence, head group) pair can take kWideMinSplits splits in one wave of one CTA per SM
// (Qwen3-30B batch ≤ 16, Llama-70B batch ≤ 8 on 132 SMs). There 4-warp CTAs leave SMs idle or
// give each pair few warps, and each CTA's chain of 64-key tiles (~0.5-1.4 µs each:
// bench/RESULTS.md 2026-12-04) is the kernel's time; the wide CTA takes twice the keys per step,
// and with RoPE inside its prologue requests twice the keys before the PDL wait. The rule reads
// no context bound: under CUDA graphs the bound is max_model_len, whatever the step's lengths.
// Head dims ≥ 64 (QStage's thread split). Measured TPOT against the 4-warp CTA (bench/RESULTS.md
// 2026-12-05), H200 / H100: Llama-70B NVFP4 fp8 b8 × 1024 −0.5 / −3.1 %, bf16 b8 — / −3.3 %;
// Qwen3-30B NVFP4 fp8 b8 −1.2 / −0.9 %, bf16 b2 −3.2 / −3.7 %, bf16 b8 −2.5 / −2.7 %; Qwen3-30B
// bf16 b1 −2.4 / −2.2 %; the serving benchmark's mean TPOT +0.5 / −1.8 %. It loses at Qwen3-30B
// fp8 b12 and b16 (+0.9 / +1.4 % and +0.7 / +0.6 %), where Llama-70B's equal grid (b6, b8) wins.
// SERVAL_DECODE_WIDE=0: the 4-warp CTA always (A/B).
constexpr int kWideMinSplits = 2;
bool use_wide_cta(const PagedAttentionParams& p, int64_t pairs) {
  switch (p.decode_cta) {
    case DecodeCta::kNarrow:
      return false;
    case DecodeCta::kWide:
      if (p.head_dim < 64 || pairs > kMaxMergeCounters)
        throw InvalidArgument(
            "paged_attention: the wide decode CTA needs head_dim ≥ 64 and at "
            "most " +
            std::to_string(kMaxMergeCounters) + " (sequence, head group) pairs, got head_dim " +
            std::to_string(p.head_dim) + " and " + std::to_string(pairs));
      return true;
    case DecodeCta::kAuto:
      break;
  }
  static const bool enabled = env_int("SERVAL_DECODE_WIDE", 0, 1, 1) == 1;
  return enabled && p.head_dim >= 64 && pairs * kWideMinSplits <= int64_t(sm_count());
}

template <int D, DType C, int W>
void launch_decode(const PagedAttentionParams& p, int num_splits, float* o_part, float* lse_part,
                   const DecodeRopeArgs* rope_args, cudaStream_t stream) {
  using S = DecodeShape<D, C, W>;
  constexpr size_t kSmem = S::kSmemBytes;
  auto kernel = rope_args ? decode_kernel<D, C, true, W> : decode_kernel<D, C, false, W>;
  allow_dynamic_smem(kernel, kSmem, rope_args ? "paged_attention_rope" : "paged_attention_decode");
  const int group = p.num_q_heads / p.num_kv_heads;
  const dim3 grid(unsigned(num_splits), unsigned(p.num_kv_heads * ((group + 15) / 16)),
                  unsigned(p.num_seqs));
  const bool fused_merge = int64_t(grid.y) * grid.z <= kMaxMergeCounters;
  const int slots = S::kCtasPerSm * sm_count();
  const int min_tiles = decode_min_tiles(S::kStages);
  constexpr float kLog2e = 1.4426950408889634f;
  launch_pdl("paged_attention_decode", kernel, grid, dim3(S::kCtaThreads), kSmem, stream,
             reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<__nv_bfloat16*>(p.out),
             static_cast<const unsigned char*>(p.k_cache),
             static_cast<const unsigned char*>(p.v_cache), p.context_lens, p.block_tables,
             p.max_blocks_per_seq, p.block_size, p.num_q_heads, p.num_kv_heads, p.scale * kLog2e,
             p.v_scale, num_splits, slots, min_tiles, fused_merge, o_part, lse_part,
             rope_args ? *rope_args : DecodeRopeArgs{});
  if (num_splits > 1 && !fused_merge) {
    // merge_kernel splits as the 4-warp CTA; wide grids merge fused (use_wide_cta's limit).
    static_assert(W == kNarrowWarps || W == kWideWarps);
    if constexpr (W == kNarrowWarps)
      launch_pdl("paged_attention_merge", merge_kernel<D>, dim3(grid.y, grid.z), dim3(kThreads), 0,
                 stream, o_part, lse_part, p.context_lens, reinterpret_cast<__nv_bfloat16*>(p.out),
                 p.num_q_heads, p.num_kv_heads, num_splits, slots, min_tiles, p.v_scale);
  }
}

// The 4-warp CTA, or the wide one (use_wide_cta) with at most one wave of splits.
template <int D, DType C>
void launch_decode(const PagedAttentionParams& p, int num_splits, float* o_part, float* lse_part,
                   const DecodeRopeArgs* rope_args, cudaStream_t stream) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const int64_t pairs = int64_t(p.num_seqs) * p.num_kv_heads * ((group + 15) / 16);
  const bool wide = use_wide_cta(p, pairs);  // never for D < 64
  if constexpr (D >= 64) {
    if (wide) {
      const int wave = int(std::max<int64_t>(1, sm_count() / pairs));
      return launch_decode<D, C, kWideWarps>(p, std::min(num_splits, wave), o_part, lse_part,
                                             rope_args, stream);
    }
  }
  launch_decode<D, C, kNarrowWarps>(p, num_splits, o_part, lse_part, rope_args, stream);
}

// fp8 caches are built for head_dim 64 and 128 only (paged_attention() rejects the rest).
template <int D>
void dispatch_decode(const PagedAttentionParams& p, int num_splits, float* o_part, float* lse_part,
                     const DecodeRopeArgs* rope_args, cudaStream_t stream) {
  switch (p.cache_dtype) {
    case DType::kBF16:
      return launch_decode<D, DType::kBF16>(p, num_splits, o_part, lse_part, rope_args, stream);
    case DType::kF8E4M3:
      if constexpr (D >= 64)
        return launch_decode<D, DType::kF8E4M3>(p, num_splits, o_part, lse_part, rope_args, stream);
      break;
    case DType::kF8E5M2:
      if constexpr (D >= 64)
        return launch_decode<D, DType::kF8E5M2>(p, num_splits, o_part, lse_part, rope_args, stream);
      break;
    default:
      break;
  }
  throw InvalidArgument("paged_attention: no decode kernel for a " +
                        std::string(dtype_name(p.cache_dtype)) + " KV cache with head_dim " +
                        std::to_string(D));
}

}  // namespace

void paged_attention_decode(const PagedAttentionParams& p, int num_splits, float* o_part,
                            float* lse_part, const DecodeRopeArgs* rope_args, cudaStream_t stream) {
  switch (p.head_dim) {
    case 16:
      return dispatch_decode<16>(p, num_splits, o_part, lse_part, rope_args, stream);
    case 32:
      return dispatch_decode<32>(p, num_splits, o_part, lse_part, rope_args, stream);
    case 64:
      return dispatch_decode<64>(p, num_splits, o_part, lse_part, rope_args, stream);
    case 128:
      return dispatch_decode<128>(p, num_splits, o_part, lse_part, rope_args, stream);
    default:
      throw InvalidArgument("paged_attention: unsupported head_dim " + std::to_string(p.head_dim));
  }
}

}  // namespace serval::kernels::cuda
