// One-shot peer-to-peer all-reduce (p2p_all_reduce.h). CTA b of every rank owns the same 16-byte
// vectors (v ≡ b·512 + thread, stride 32·512), so it only waits for CTA b of each peer:
//   1. call = ++calls[b]; half = call % 2 selects the staging half;
//   2. copy its vectors of `data` into its own staging half;
//   3. bar.sync, then thread p (p ≠ rank) stores `call` to peer p's flags[b][rank] with release
//      semantics at system scope (covering the CTA's staging stores ordered before it by the
//      barrier) and spins with acquire loads on its own flags[b][p] until peer p reached `call`;
//   4. bar.sync, then each vector is the fp32 sum of the ranks' staging vectors in rank order
//      (L2 loads, .cg: never a stale L1 line of an earlier call), rounded once, stored to data.
// Staging half `half` is rewritten by a rank only at call + 2, after it passed the barrier of
// call + 1, which needs every peer to have started call + 1 and so finished reading call's.
#include "kernels/cuda/comm/p2p_all_reduce.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"

namespace serval::kernels::cuda {

namespace {

constexpr int kThreads = 512;
constexpr size_t kFlagBytes = size_t(kP2pBlocks) * kP2pMaxRanks * 4;
constexpr size_t kCallBytes = size_t(kP2pBlocks) * 4;
constexpr size_t kTableBytes = size_t(kP2pMaxRanks) * sizeof(uint8_t*);

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
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

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) p2p_all_reduce_kernel(P2pAllReduceParams p) {
  constexpr int kN = kBf16 ? 8 : 4;
  const int b = blockIdx.x, tid = threadIdx.x;
  uint8_t* mine = p.block;
  uint32_t* my_flags = reinterpret_cast<uint32_t*>(mine + 2 * p.max_bytes);
  uint32_t* calls = reinterpret_cast<uint32_t*>(mine + 2 * p.max_bytes + kFlagBytes);
  __shared__ uint32_t s_call;
  __shared__ uint8_t* s_base[kP2pMaxRanks];
  if (tid < kP2pMaxRanks)
    s_base[tid] =
        reinterpret_cast<uint8_t* const*>(mine + 2 * p.max_bytes + kFlagBytes + kCallBytes)[tid];
  if (tid == 0) {
    s_call = calls[b] + 1;
    calls[b] = s_call;
  }
  __syncthreads();
  const uint32_t call = s_call;
  const size_t half = size_t(call & 1u) * p.max_bytes;
  const int64_t vectors = p.count / kN;
  const int64_t first = int64_t(b) * kThreads + tid, stride = int64_t(kP2pBlocks) * kThreads;

  uint4* data = static_cast<uint4*>(p.data);
  uint4* stage = reinterpret_cast<uint4*>(mine + half);
  for (int64_t v = first; v < vectors; v += stride) stage[v] = data[v];
  __syncthreads();
  if (tid < p.ranks && tid != p.rank) {
    uint32_t* peer_flags = reinterpret_cast<uint32_t*>(s_base[tid] + 2 * p.max_bytes);
    st_release_sys(peer_flags + b * kP2pMaxRanks + p.rank, call);
    const uint32_t* from_peer = my_flags + b * kP2pMaxRanks + tid;
    // The abort word is host memory (a PCIe round trip): read it once per 1024 polls.
    for (uint32_t spin = 1; int32_t(ld_acquire_sys(from_peer) - call) < 0; ++spin)
      if (spin % 1024 == 0 && *p.aborted) break;
  }
  __syncthreads();

  for (int64_t v = first; v < vectors; v += stride) {
    float acc[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[i] = 0.0f;
    for (int r = 0; r < p.ranks; ++r)
      add_vector<kBf16>(acc, __ldcg(reinterpret_cast<const uint4*>(s_base[r] + half) + v));
    data[v] = pack_vector<kBf16>(acc);
  }
}

}  // namespace

size_t p2p_rank_bytes(size_t max_bytes) {
  return 2 * max_bytes + kFlagBytes + kCallBytes + kTableBytes;
}

void p2p_init_rank(uint8_t* block, size_t max_bytes, const uint8_t* const* blocks, int ranks) {
  if (ranks < 2 || ranks > kP2pMaxRanks || max_bytes % 16 != 0)
    throw InvalidArgument("p2p_init_rank: need 2.." + std::to_string(kP2pMaxRanks) +
                          " ranks and a staging size in 16-byte units");
  const uint8_t* table[kP2pMaxRanks] = {};
  for (int r = 0; r < ranks; ++r) table[r] = blocks[r];
  uint8_t* meta = block + 2 * max_bytes;
  cudaError_t e = cudaMemset(meta, 0, kFlagBytes + kCallBytes);
  if (e == cudaSuccess)
    e = cudaMemcpy(meta + kFlagBytes + kCallBytes, table, kTableBytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(std::string("p2p_init_rank: ") + cudaGetErrorString(e));
  }
}

void p2p_all_reduce(const P2pAllReduceParams& p, cudaStream_t stream) {
  const size_t elem = p.dtype == DType::kBF16 ? 2 : 4;
  const size_t bytes = size_t(p.count) * elem;
  bool ok = (p.dtype == DType::kBF16 || p.dtype == DType::kF32) && p.count > 0 &&
            bytes <= p.max_bytes && bytes % 16 == 0 && p.max_bytes % 16 == 0 &&
            reinterpret_cast<uintptr_t>(p.data) % 16 == 0 && p.ranks >= 2 &&
            p.ranks <= kP2pMaxRanks && p.rank >= 0 && p.rank < p.ranks && p.aborted != nullptr &&
            p.block != nullptr;
  if (!ok)
    throw InvalidArgument(
        "p2p_all_reduce: need bf16 or f32 data, 16-byte aligned, a multiple of "
        "16 bytes up to the staging size (" +
        std::to_string(p.max_bytes) + " bytes), 2.." + std::to_string(kP2pMaxRanks) +
        " ranks with staging; got " + std::to_string(bytes) + " bytes, rank " +
        std::to_string(p.rank) + " of " + std::to_string(p.ranks));
  if (p.dtype == DType::kBF16) {
    p2p_all_reduce_kernel<true><<<kP2pBlocks, kThreads, 0, stream>>>(p);
  } else {
    p2p_all_reduce_kernel<false><<<kP2pBlocks, kThreads, 0, stream>>>(p);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("CUDA kernel p2p_all_reduce failed to launch: ") +
                cudaGetErrorString(e));
}

}  // namespace serval::kernels::cuda
