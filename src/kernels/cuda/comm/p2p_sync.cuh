// Device side of a rank's p2p block (layout in p2p_all_reduce.h), shared by the peer-to-peer
// all-reduce kernels: the call counter, the staging halves and the flag handshake.
//
// Every kernel using a block follows one protocol, so plain and fused all-reduces may alternate:
//   - CTA b of every rank advances calls[b] once per call (fixed grid of kP2pBlocks CTAs), so all
//     ranks agree on the call number and on its staging half (call % 2);
//   - a kernel may advance the counter before its pdl_wait (the fused kernel does) only when it
//     does so, fenced, before its PDL trigger: the next all-reduce then starts after the update;
//   - a CTA signals call c to its peers only after its own pdl_wait (when launched with PDL), so
//     every kernel before it on this rank, the all-reduce of call c − 1 included, has completed;
//   - a staging half is written at call c + 2 at the earliest, by a CTA that has seen every
//     peer's signal of call c + 1 (so every peer's call-c kernel, and its staging reads, are over).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/comm/p2p_all_reduce.h"

namespace serval::kernels::cuda::p2p {

constexpr size_t kFlagBytes = size_t(kP2pBlocks) * kP2pMaxRanks * 4;
constexpr size_t kCallBytes = size_t(kP2pBlocks) * 4;
constexpr size_t kTableBytes = size_t(kP2pMaxRanks) * sizeof(uint8_t*);

// flags [kP2pBlocks][kP2pMaxRanks] u32, after the two staging halves.
__device__ __forceinline__ uint32_t* flags_of(uint8_t* block, size_t max_bytes) {
  return reinterpret_cast<uint32_t*>(block + 2 * max_bytes);
}

__device__ __forceinline__ uint32_t* calls_of(uint8_t* block, size_t max_bytes) {
  return reinterpret_cast<uint32_t*>(block + 2 * max_bytes + kFlagBytes);
}

__device__ __forceinline__ uint8_t* const* table_of(uint8_t* block, size_t max_bytes) {
  return reinterpret_cast<uint8_t* const*>(block + 2 * max_bytes + kFlagBytes + kCallBytes);
}

// The low-latency staging after the table: two halves of max_bytes of 8-byte words, each a
// 4-byte payload in its low half and the call that wrote it in its high half (p2p_all_reduce_norm).
__device__ __forceinline__ uint8_t* ll_of(uint8_t* block, size_t max_bytes) {
  return block + 2 * max_bytes + kFlagBytes + kCallBytes + kTableBytes;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// CTA-wide: thread 0 advances this CTA's call counter; every thread gets the new call number
// and, in s_base, every rank's block address. Ends with a barrier.
__device__ __forceinline__ uint32_t begin_call(uint8_t* block, size_t max_bytes, uint8_t** s_base,
                                               uint32_t* s_call) {
  const int tid = threadIdx.x;
  if (tid < kP2pMaxRanks) s_base[tid] = table_of(block, max_bytes)[tid];
  if (tid == 0) {
    uint32_t* calls = calls_of(block, max_bytes);
    *s_call = calls[blockIdx.x] + 1;
    calls[blockIdx.x] = *s_call;
  }
  __syncthreads();
  return *s_call;
}

// CTA-wide, after the CTA's staging stores for `call`: bar.sync, then thread p (p ≠ rank)
// announces `call` to peer p with release semantics at system scope (covering the stores the
// barrier ordered before it) and waits with acquire loads until peer p announced `call` too (or
// the group's host-mapped abort word is set: read once per 1024 polls, a PCIe round trip). Ends
// with a barrier, after which the peers' stores of `call` are visible to the whole CTA.
__device__ __forceinline__ void exchange_flags(uint8_t* const* s_base, uint8_t* block,
                                               size_t max_bytes, int rank, int ranks, uint32_t call,
                                               const volatile uint32_t* aborted) {
  const int tid = threadIdx.x, b = blockIdx.x;
  __syncthreads();
  if (tid < ranks && tid != rank) {
    st_release_sys(flags_of(s_base[tid], max_bytes) + b * kP2pMaxRanks + rank, call);
    const uint32_t* from_peer = flags_of(block, max_bytes) + b * kP2pMaxRanks + tid;
    for (uint32_t spin = 1; int32_t(ld_acquire_sys(from_peer) - call) < 0; ++spin)
      if (spin % 1024 == 0 && *aborted) break;
  }
  __syncthreads();
}

// acc[0..kN) += the kN values of one 16-byte vector (8 bf16 or 4 f32).
template <bool kBf16>
__device__ __forceinline__ void add_vector(float* acc, uint4 q) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  if constexpr (kBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] += __uint_as_float(w[i] << 16);
      acc[2 * i + 1] += __uint_as_float(w[i] & 0xFFFF0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += __uint_as_float(w[i]);
  }
}

template <bool kBf16>
__device__ __forceinline__ uint4 pack_vector(const float* acc) {
  uint32_t w[4];
  if constexpr (kBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __float_as_uint(acc[i]);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace serval::kernels::cuda::p2p
