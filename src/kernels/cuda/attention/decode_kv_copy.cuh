// The decode kernel's KV tile copies (paged_decode.cu): block-table entries → cache slots →
// cp.async of a thread's 16-byte chunks of its key rows into a [K | V] stage, and the L1 prefetch
// of the entries the tile loop reads later.
#pragma once
#include <cstdint>

#include "base/dtype.h"
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/decode_shape.cuh"
#include "kernels/cuda/misc/cp_async.cuh"

namespace serval::kernels::cuda::decode {

using namespace attn;

// Where this thread's copies read: its 16-byte chunk of its KV head in cache slot 0 of the K and
// V caches, and the bytes from one slot to the next (Hkv · D · element bytes < 2^31).
struct KvSource {
  const unsigned char* k;
  const unsigned char* v;
  int slot_bytes;
};

// cp.async of one [K | V] tile: this thread's key rows (first + i·kRowStep) from the cache slots
// `slot` (−1: past key_end, zero-filled), its 16-byte chunk `chunk` of each row.
// S: the CTA's DecodeShape (also below).
template <class S>
__device__ __forceinline__ void issue_tile(unsigned char* stage, const KvSource& src,
                                           const int (&slot)[S::kRowsPerThread], int first,
                                           int chunk) {
#pragma unroll
  for (int i = 0; i < S::kRowsPerThread; ++i) {
    // One 32 × 32 → 64-bit multiply; a zero-filled row (slot −1) reads nothing at slot 0.
    const int64_t off = int64_t(max(slot[i], 0)) * src.slot_bytes;
    const bool valid = slot[i] >= 0;
    const int dst = (first + i * S::kRowStep) * S::kRowBytes + chunk * 16;
    cp_async_16(stage + dst, src.k + off, valid);
    cp_async_16(stage + S::kTileBytes + dst, src.v + off, valid);
  }
}

// Block-table entries of this thread's key rows of the tile starting at key0, unconditionally
// (the index clamped into the table row): they can be loaded before the context length is known.
template <class S>
__device__ __forceinline__ void fetch_entries(int (&entry)[S::kRowsPerThread],
                                              const int32_t* __restrict__ table,
                                              const PagedBlocks& blocks, int max_blocks_per_seq,
                                              int key0, int first) {
#pragma unroll
  for (int i = 0; i < S::kRowsPerThread; ++i)
    entry[i] = table[min(blocks.block(key0 + first + i * S::kRowStep), max_blocks_per_seq - 1)];
}

// Cache slots of this thread's key rows of the tile starting at key0 from their block-table
// entries (−1 past key_end).
template <class S>
__device__ __forceinline__ void entries_to_slots(int (&slot)[S::kRowsPerThread],
                                                 const int (&entry)[S::kRowsPerThread],
                                                 const PagedBlocks& blocks, int key0, int key_end,
                                                 int first) {
#pragma unroll
  for (int i = 0; i < S::kRowsPerThread; ++i) {
    const int key = key0 + first + i * S::kRowStep;
    slot[i] = key < key_end ? blocks.slot32(entry[i], key) : -1;
  }
}

// Brings the block-table entries [first, last] into L1, one prefetch per 128-byte line. The main
// loop reads a tile's entries one iteration before it copies the tile; a read that goes to L2
// queues behind the KV copies in flight, and the next copy's slot arithmetic waits for it (ncu,
// batch 64, fp8: the largest long-scoreboard stalls of the loop). By the CTA's kCtaThreads threads.
template <int kCtaThreads>
__device__ __forceinline__ void prefetch_table_l1(const int32_t* table, int first, int last) {
  for (int e = first + int(threadIdx.x) * 32; e <= last; e += kCtaThreads * 32)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(table + e));
  if (threadIdx.x == 0) asm volatile("prefetch.global.L1 [%0];" ::"l"(table + last));
}

}  // namespace serval::kernels::cuda::decode
