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
#include "kernels/cuda/comm/p2p_sync.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr int kThreads = 512;

using p2p::kCallBytes;
using p2p::kFlagBytes;
using p2p::kTableBytes;

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) p2p_all_reduce_kernel(P2pAllReduceParams p) {
  constexpr int kN = kBf16 ? 8 : 4;
  const int b = blockIdx.x, tid = threadIdx.x;
  uint8_t* mine = p.block;
  __shared__ uint32_t s_call;
  __shared__ uint8_t* s_base[kP2pMaxRanks];
  const uint32_t call = p2p::begin_call(mine, p.max_bytes, s_base, &s_call);
  const size_t half = size_t(call & 1u) * p.max_bytes;
  const int64_t vectors = p.count / kN;
  const int64_t first = int64_t(b) * kThreads + tid, stride = int64_t(kP2pBlocks) * kThreads;

  uint4* data = static_cast<uint4*>(p.data);
  uint4* stage = reinterpret_cast<uint4*>(mine + half);
  for (int64_t v = first; v < vectors; v += stride) stage[v] = data[v];
  p2p::exchange_flags(s_base, mine, p.max_bytes, p.rank, p.ranks, call, p.aborted);

  for (int64_t v = first; v < vectors; v += stride) {
    float acc[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[i] = 0.0f;
    for (int r = 0; r < p.ranks; ++r)
      p2p::add_vector<kBf16>(acc, __ldcg(reinterpret_cast<const uint4*>(s_base[r] + half) + v));
    data[v] = p2p::pack_vector<kBf16>(acc);
  }
}

}  // namespace

size_t p2p_rank_bytes(size_t max_bytes) {
  return 4 * max_bytes + kFlagBytes + kCallBytes + kTableBytes;  // plain and LL staging
}

void p2p_init_rank(uint8_t* block, size_t max_bytes, const uint8_t* const* blocks, int ranks) {
  if (ranks < 2 || ranks > kP2pMaxRanks || max_bytes % 16 != 0)
    throw InvalidArgument("p2p_init_rank: need 2.." + std::to_string(kP2pMaxRanks) +
                          " ranks and a staging size in 16-byte units");
  const uint8_t* table[kP2pMaxRanks] = {};
  for (int r = 0; r < ranks; ++r) table[r] = blocks[r];
  uint8_t* meta = block + 2 * max_bytes;
  cudaError_t e = cudaMemset(meta, 0, kFlagBytes + kCallBytes);
  // LL words start with call 0 in their high halves, a call no kernel makes (counters start at 1).
  if (e == cudaSuccess)
    e = cudaMemset(meta + kFlagBytes + kCallBytes + kTableBytes, 0, 2 * max_bytes);
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
