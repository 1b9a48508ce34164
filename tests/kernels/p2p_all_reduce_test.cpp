// p2p_all_reduce on every GPU of the machine (skipped with fewer than two or without peer
// access): each rank's thread runs a sequence of all-reduces of different sizes and dtypes on its
// own stream; every rank must get the fp32 sum in rank order of all ranks' inputs, rounded once
// (bit-exact with the host sum), every call, eagerly and replayed from a CUDA graph.
#include "kernels/cuda/comm/p2p_all_reduce.h"

#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "kernels/bench_timing.h"
#include "kernels/cuda_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/p2p_test_group.h"

namespace serval::testing {
namespace {

namespace kc = kernels::cuda;

struct Call {
  int64_t count;
  DType dtype;
};

// Rank r's input of call c: distinct random values per (rank, call).
std::vector<uint8_t> input(int r, int c, const Call& call) {
  std::vector<uint8_t> bytes(size_t(call.count) * (call.dtype == DType::kBF16 ? 2 : 4));
  if (call.dtype == DType::kBF16) {
    const std::vector<bf16> v = random_bf16(size_t(call.count), uint32_t(1000 * c + r), -4, 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    const std::vector<bf16> v = random_bf16(size_t(call.count), uint32_t(1000 * c + r), -4, 4);
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]) * 1.0001f;
    std::memcpy(bytes.data(), f.data(), bytes.size());
  }
  return bytes;
}

// The expected output: fp32 sum in rank order, rounded to the dtype once.
std::vector<uint8_t> expected(int n, int c, const Call& call) {
  std::vector<float> sum(size_t(call.count), 0.0f);
  for (int r = 0; r < n; ++r) {
    const std::vector<uint8_t> in = input(r, c, call);
    for (int64_t i = 0; i < call.count; ++i) {
      float v;
      if (call.dtype == DType::kBF16) {
        bf16 b;
        std::memcpy(&b.bits, in.data() + 2 * i, 2);
        v = bf16_to_float(b);
      } else {
        std::memcpy(&v, in.data() + 4 * i, 4);
      }
      sum[size_t(i)] += v;
    }
  }
  std::vector<uint8_t> out(size_t(call.count) * (call.dtype == DType::kBF16 ? 2 : 4));
  for (int64_t i = 0; i < call.count; ++i) {
    if (call.dtype == DType::kBF16) {
      const bf16 b = float_to_bf16(sum[size_t(i)]);
      std::memcpy(out.data() + 2 * i, &b.bits, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &sum[size_t(i)], 4);
    }
  }
  return out;
}

TEST(P2pAllReduce, EveryRankGetsTheRankOrderSum) {
  const int n = gpu_count_for_collectives();
  if (n < 2 || !peers_ok(n)) GTEST_SKIP() << "needs two peer-accessible CUDA GPUs: skipped";
  Group g(n);
  const std::vector<Call> calls = {
      {8, DType::kBF16},   {8192, DType::kBF16},   {4, DType::kF32},   {65536, DType::kBF16},
      {8192, DType::kF32}, {524288, DType::kBF16}, {24, DType::kBF16}, {262144, DType::kF32}};
  std::vector<std::vector<std::vector<uint8_t>>> got(static_cast<size_t>(n));
  run_ranks(n, [&](int r, cudaStream_t s) {
    for (int rep = 0; rep < 3; ++rep)  // the staging halves alternate: repeat the sequence
      for (size_t c = 0; c < calls.size(); ++c) {
        const std::vector<uint8_t> in = input(r, int(c), calls[c]);
        void* d = nullptr;
        cuda_check(cudaMalloc(&d, in.size()), "malloc");
        cuda_check(cudaMemcpy(d, in.data(), in.size(), cudaMemcpyHostToDevice), "upload");
        kc::p2p_all_reduce(
            {d, calls[c].count, calls[c].dtype, r, n, kMaxBytes, g.blocks[size_t(r)], g.aborted},
            s);
        std::vector<uint8_t> out(in.size());
        cuda_check(cudaMemcpyAsync(out.data(), d, in.size(), cudaMemcpyDeviceToHost, s), "dl");
        cuda_check(cudaStreamSynchronize(s), "sync");
        cuda_check(cudaFree(d), "free");
        if (rep == 2) got[size_t(r)].push_back(std::move(out));
      }
  });
  if (HasFailure()) return;
  for (size_t c = 0; c < calls.size(); ++c) {
    const std::vector<uint8_t> want = expected(n, int(c), calls[c]);
    for (int r = 0; r < n; ++r) EXPECT_EQ(got[size_t(r)][c], want) << "call " << c << " rank " << r;
  }
}

// Four all-reduces captured in one CUDA graph per rank, replayed five times with new inputs
// copied in before each replay: the call counters live on the device, so every replay is a new
// call and gives the new sums.
TEST(P2pAllReduce, GraphReplaysAreNewCalls) {
  const int n = gpu_count_for_collectives();
  if (n < 2 || !peers_ok(n)) GTEST_SKIP() << "needs two peer-accessible CUDA GPUs: skipped";
  Group g(n);
  const Call call{8192, DType::kBF16};
  std::vector<std::vector<std::vector<uint8_t>>> got(static_cast<size_t>(n));
  run_ranks(n, [&](int r, cudaStream_t s) {
    DeviceBuffer<bf16> d(size_t(call.count));
    CapturedGraph graph(s, [&](cudaStream_t cs) {
      for (int i = 0; i < 4; ++i)  // sum of sums: 4 rounds
        kc::p2p_all_reduce(
            {d.get(), call.count, call.dtype, r, n, kMaxBytes, g.blocks[size_t(r)], g.aborted}, cs);
    });
    for (int rep = 0; rep < 5; ++rep) {
      const std::vector<uint8_t> in = input(r, rep, call);
      cuda_check(cudaMemcpyAsync(d.get(), in.data(), in.size(), cudaMemcpyHostToDevice, s), "up");
      graph.launch(s);
      std::vector<uint8_t> out(in.size());
      cuda_check(cudaMemcpyAsync(out.data(), d.get(), in.size(), cudaMemcpyDeviceToHost, s), "dl");
      cuda_check(cudaStreamSynchronize(s), "sync");
      got[size_t(r)].push_back(std::move(out));
    }
  });
  if (HasFailure()) return;
  for (int rep = 0; rep < 5; ++rep) {
    // Round 1 sums the inputs; rounds 2..4 sum n equal copies (every rank holds the same bits).
    std::vector<uint8_t> want = expected(n, rep, call);
    for (int round = 1; round < 4; ++round)
      for (int64_t i = 0; i < call.count; ++i) {
        bf16 b;
        std::memcpy(&b.bits, want.data() + 2 * i, 2);
        float sum = 0.0f;
        for (int r = 0; r < n; ++r) sum += bf16_to_float(b);
        b = float_to_bf16(sum);
        std::memcpy(want.data() + 2 * i, &b.bits, 2);
      }
    for (int r = 0; r < n; ++r) EXPECT_EQ(got[size_t(r)][size_t(rep)], want) << "replay " << rep;
  }
}

// A rank that never arrives: with the abort word set, the waiting rank's kernel returns.
TEST(P2pAllReduce, AbortReleasesAWaitingRank) {
  const int n = gpu_count_for_collectives();
  if (n < 2 || !peers_ok(n)) GTEST_SKIP() << "needs two peer-accessible CUDA GPUs: skipped";
  Group g(n);
  cuda_check(cudaSetDevice(0), "set device");
  DeviceBuffer<bf16> x(random_bf16(64, 7));
  kc::p2p_all_reduce({x.get(), 64, DType::kBF16, 0, n, kMaxBytes, g.blocks[0], g.aborted}, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady) << "returned without its peers";
  *g.aborted = 1;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(P2pAllReduce, RejectsSizesOutsideTheContract) {
  uint8_t* fake = reinterpret_cast<uint8_t*>(uintptr_t(256));
  uint32_t word = 0;
  kc::P2pAllReduceParams p{fake, 8, DType::kBF16, 0, 2, kMaxBytes, fake, &word};
  p.count = 7;  // 14 bytes: not a multiple of 16
  EXPECT_THROW(kc::p2p_all_reduce(p, nullptr), InvalidArgument);
  p.count = int64_t(kMaxBytes);  // 2 MB of bf16 > the staging size
  EXPECT_THROW(kc::p2p_all_reduce(p, nullptr), InvalidArgument);
  p.count = 8;
  p.dtype = DType::kF16;
  EXPECT_THROW(kc::p2p_all_reduce(p, nullptr), InvalidArgument);
  p.dtype = DType::kBF16;
  p.ranks = 1;
  EXPECT_THROW(kc::p2p_all_reduce(p, nullptr), InvalidArgument);
}

// Per-call latency of the P2P all-reduce and of ncclAllReduce for decode-sized bf16 tensors: 100
// calls captured in one CUDA graph per rank, replayed 5 times (µs per call of the median replay).
TEST(P2pAllReduceBench, DISABLED_LatencyVsNccl) {
  const int n = gpu_count_for_collectives();
  if (n < 2 || !peers_ok(n)) GTEST_SKIP() << "needs two peer-accessible CUDA GPUs: skipped";
  Group g(n);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  std::vector<int> devs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) devs[size_t(r)] = r;
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess);
  constexpr int kCalls = 100;
  for (int64_t count : {int64_t(8192), int64_t(65536), int64_t(524288)}) {
    for (bool nccl : {false, true}) {
      std::vector<double> us(static_cast<size_t>(n));
      run_ranks(n, [&](int r, cudaStream_t s) {
        DeviceBuffer<bf16> x(random_bf16(size_t(count), uint32_t(r)));
        // NCCL needs the relaxed capture mode here (it fails in thread-local mode).
        CapturedGraph graph(
            s,
            [&](cudaStream_t cs) {
              for (int i = 0; i < kCalls; ++i) {
                if (nccl) {
                  ncclAllReduce(x.get(), x.get(), size_t(count), ncclBfloat16, ncclSum,
                                comms[size_t(r)], cs);
                } else {
                  kc::p2p_all_reduce({x.get(), count, DType::kBF16, r, n, kMaxBytes,
                                      g.blocks[size_t(r)], g.aborted},
                                     cs);
                }
              }
            },
            cudaStreamCaptureModeRelaxed);
        graph.launch(s);  // warm-up
        us[size_t(r)] = 1000.0 *
                        median_event_ms(
                            s, [&] { graph.launch(s); }, 5) /
                        kCalls;
      });
      if (HasFailure()) break;
      std::printf("all-reduce %7lld bf16 (%4lld KB) over %d GPUs, %s: %.2f us per call (rank 0)\n",
                  static_cast<long long>(count), static_cast<long long>(count * 2 / 1024), n,
                  nccl ? "NCCL" : "P2P ", us[0]);
    }
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

}  // namespace
}  // namespace serval::testing
