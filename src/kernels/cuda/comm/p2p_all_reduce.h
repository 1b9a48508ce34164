// One-shot all-reduce over the peer-accessible GPUs of one process (NVLink), for the small
// tensors of tensor-parallel decode steps where NCCL's latency dominates. Every rank launches
// p2p_all_reduce on its own stream with the same count; each copies its tensor into its staging
// buffer, signals every peer, waits for every peer's signal and sums all staging buffers in rank
// order 0..N-1 (fp32 accumulation), so every rank gets the same bits. Capturable in CUDA graphs:
// the call counters live in device memory, so a replay is a new call.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

constexpr int kP2pMaxRanks = 8;
constexpr int kP2pBlocks = 32;  // fixed grid: every CTA's call counter advances on every call

// Device memory of one rank ("block"), allocated on that rank's GPU, p2p_rank_bytes bytes:
//   staging [2][max_bytes]: the two halves alternate between calls, so a rank may stage call
//     k + 1 while slower peers still read call k;
//   flags [kP2pBlocks][kP2pMaxRanks] u32: flags[b][p] = the last call of CTA b that rank p
//     announced to this rank;
//   calls [kP2pBlocks] u32: this rank's CTA b call counter;
//   table [kP2pMaxRanks]: every rank's block address (peer access enabled between all GPUs);
//   ll [2][max_bytes]: low-latency staging of the fused all-reduce + norm (p2p_all_reduce_norm.h),
//     8-byte words of payload and call number, apart from the plain staging so that no stale
//     plain data can pass for a word of the current call.
size_t p2p_rank_bytes(size_t max_bytes);

// Zeroes flags and counters of `block` (rank `rank` of blocks.size()) and writes its table;
// synchronous, on the current device, before the first call.
void p2p_init_rank(uint8_t* block, size_t max_bytes, const uint8_t* const* blocks, int ranks);

struct P2pAllReduceParams {
  void* data;     // [count] in/out on this rank's GPU, 16-byte aligned
  int64_t count;  // count · dtype size ≤ max_bytes and a multiple of 16 bytes
  DType dtype;    // kBF16 or kF32
  int rank, ranks;
  size_t max_bytes;
  uint8_t* block;  // this rank's block (p2p_init_rank done)
  // Host-mapped word of the group: nonzero once a rank failed; waiting CTAs then give up (the
  // step's results are discarded) instead of spinning forever on a peer that will not come.
  const volatile uint32_t* aborted;
};

// Throws InvalidArgument for a count, dtype or alignment outside the contract.
void p2p_all_reduce(const P2pAllReduceParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
