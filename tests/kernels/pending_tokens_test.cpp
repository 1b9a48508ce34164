// resolve_pending_tokens (token feedback) against its CPU twin (the CPU backend's op) on random
// ids, about half of them pending, for sizes around the kernel's 256-thread blocks; every id of
// the output checked.
#include "kernels/cuda/sampling/pending_tokens.h"

#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "kernels/gpu_test_support.h"
#include "kernels/moe_test_util.h"

namespace serval::kernels::cuda {
namespace {

using serval::testing::moe_util::cuda_ok;
using serval::testing::moe_util::DeviceBuffer;
using serval::testing::moe_util::Rng;

TEST(PendingTokens, MatchesTheCpuTwin) {
  if (!serval::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto cpu = backend::make_cpu_backend();
  Rng rng(2026);
  for (int n : {1, 7, 255, 256, 257, 1000, 4097}) {
    for (int rows : {1, 3, 64, 512}) {
      SCOPED_TRACE(::testing::Message() << n << " ids, " << rows << " sampled rows");
      std::vector<int32_t> sampled(static_cast<size_t>(rows)), ids(static_cast<size_t>(n));
      for (int32_t& s : sampled) s = int32_t(rng.next() % 150000u);
      for (int32_t& id : ids)
        id = rng.next() % 2 ? int32_t(rng.next() % 150000u) : -int32_t(rng.next() % rows) - 1;
      DeviceBuffer d_ids(ids), d_sampled(sampled);
      resolve_pending_tokens({d_ids.as<int32_t>(), d_sampled.as<int32_t>(), n}, nullptr);
      cuda_ok(cudaGetLastError(), "resolve_pending_tokens");
      const std::vector<int32_t> got = d_ids.download<int32_t>(size_t(n));

      Tensor want = host_empty(DType::kI32, {n}), cpu_sampled = host_empty(DType::kI32, {rows});
      std::copy(ids.begin(), ids.end(), want.as<int32_t>());
      std::copy(sampled.begin(), sampled.end(), cpu_sampled.as<int32_t>());
      cpu->resolve_pending_tokens(want, cpu_sampled);
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(got[size_t(i)], want.as<int32_t>()[i])
            << "id " << i << " (input " << ids[i] << ")";
        ASSERT_GE(got[size_t(i)], 0);
      }
    }
  }
}

}  // namespace
}  // namespace serval::kernels::cuda
