// The peer-to-peer all-reduce tests' group: staging blocks on every GPU of the machine with
// peer access on, and the host-mapped abort word (what the NCCL communicator's P2pGroup sets up).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/comm/p2p_all_reduce.h"
#include "kernels/cuda_test_util.h"

namespace serval::testing {

inline constexpr size_t kMaxBytes = size_t(1) << 20;

inline bool peers_ok(int n) {
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      int ok = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) return false;
    }
  return true;
}

// Staging blocks on every GPU, peer access on, plus the host-mapped abort word.
struct Group {
  int n = 0;
  std::vector<uint8_t*> blocks;
  uint32_t* aborted = nullptr;
  explicit Group(int ranks) : n(ranks), blocks(size_t(ranks)) {
    for (int i = 0; i < n; ++i) {
      cuda_check(cudaSetDevice(i), "set device");
      for (int j = 0; j < n; ++j)
        if (j != i && cudaDeviceEnablePeerAccess(j, 0) != cudaSuccess) (void)cudaGetLastError();
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&blocks[size_t(i)]),
                            kernels::cuda::p2p_rank_bytes(kMaxBytes)),
                 "malloc");
    }
    for (int i = 0; i < n; ++i) {
      cuda_check(cudaSetDevice(i), "set device");
      kernels::cuda::p2p_init_rank(blocks[size_t(i)], kMaxBytes, blocks.data(), n);
    }
    cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&aborted), 4,
                             cudaHostAllocMapped | cudaHostAllocPortable),
               "host alloc");
    *aborted = 0;
  }
  ~Group() {
    for (int i = 0; i < n; ++i) {
      (void)cudaSetDevice(i);
      (void)cudaFree(blocks[size_t(i)]);
    }
    (void)cudaFreeHost(aborted);
  }
};

// Runs fn(r, stream) for every rank r < n on a thread of its own, with device r current and a new
// stream of it (destroyed afterwards). A rank's exception becomes a test failure naming the rank
// (a throw out of a thread would end the test binary); returns once every rank is done.
inline void run_ranks(int n, const std::function<void(int, cudaStream_t)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cudaStream_t stream = nullptr;
      try {
        cuda_check(cudaSetDevice(r), "set device");
        cuda_check(cudaStreamCreate(&stream), "stream");
        fn(r, stream);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
      if (stream) (void)cudaStreamDestroy(stream);
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[size_t(r)].empty()) ADD_FAILURE() << "rank " << r << ": " << errors[size_t(r)];
}

}  // namespace serval::testing
