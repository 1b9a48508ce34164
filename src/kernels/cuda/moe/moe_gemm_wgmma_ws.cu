// Warp-specialized wgmma grouped GEMM of the throughput MoE backend (bf16 experts): the tile of
// moe_gemm_wgmma.cu at 256 weight rows, with the loads taken off the math warps.
//
// Warpgroup 0 produces: it gives back registers (setmaxnreg) and copies each stage's A (256
// weight rows) and B (128 token rows) tiles with cp.async, announcing a stage on its `full`
// mbarrier once its copies land (cp.async.mbarrier.arrive). Warpgroups 1 and 2 consume: each
// takes 128 weight rows as two m64n128 accumulators, waits for a stage's `full` barrier, runs its
// 8 wgmma, and once the stage before has been read (wgmma.wait_group 1) releases that stage on
// its `empty` barrier. No CTA-wide barrier in the main loop: loads run ahead by up to 4 stages
// whatever the math warps do.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/misc/cp_async.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/mbarrier.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"
#include "kernels/cuda/misc/wgmma.cuh"
#include "kernels/cuda/moe/moe_gemm_tile.cuh"
#include "kernels/cuda/moe/moe_gemm_wgmma.h"
#include "kernels/cuda/moe/moe_gemm_wgmma_tile.cuh"

namespace serval::kernels::cuda {

namespace {

using moe_wgmma::kBK;
using moe_wgmma::kBN;
constexpr int kBM = 256, kMb = 2;  // weight rows per CTA; m64 blocks per consumer warpgroup
constexpr int kStages = 4;
constexpr int kThreads = 384;  // producer warpgroup 0, consumer warpgroups 1 and 2
constexpr uint32_t kABytes = kBM * kBK * 2, kStageBytes = kABytes + kBN * kBK * 2;  // 48 KB
constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + 2 * kStages * 8 + 1024;
// Registers per thread after the hand-over (see wgmma::cta_register_allocation).
constexpr int kProducerRegs = 64, kConsumerRegs = 216;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= wgmma::cta_register_allocation(kThreads),
              "the register hand-over must fit the CTA's allocation");

// Work item i = (weight block i % m_blocks, token tile i / m_blocks); CTA b runs items b,
// b + gridDim.x, ... below num_tiles · m_blocks. Both roles walk the same items, so a stage's use
// count `it` (and its barrier phase) agrees between them across items.
template <bool kGemm1>
__global__ void __launch_bounds__(kThreads, 1)
    moe_gemm_ws_kernel(MoeGemmParams p, int m_blocks, bool narrow) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = raw + ((1024 - (raw & 1023)) & 1023);  // swizzle atoms: 1024-aligned
  auto stage = [&](int s) { return smem + uint32_t(s) * kStageBytes; };
  const moe_wgmma::StageRing<kStages> ring{smem + kStages * kStageBytes};
  const int tid = threadIdx.x, wg = tid / 128;

  const int items = moe_persistent_items<kGemm1>(p, m_blocks);
  auto expert_of = [&](int tile) { return moe_persistent_expert<kGemm1>(p, tile); };
  if (tid == 0) ring.init();
  __syncthreads();
  const int K = p.k, KT = K / kBK;

  if (wg == 0) {
    wgmma::release_registers<kProducerRegs>();
    if constexpr (!kGemm1) {
      pdl_wait();  // GEMM1's act is complete from here on
      pdl_launch_dependents();
    }
    // Thread t copies chunk column t % 8 of rows t / 8 + 16j: A rows j = 0..15 are one pointer
    // and a stride apart (weight_row is linear in j for r = t/8 + 16j), B rows are gathered.
    const int kc = tid & 7, r0 = tid / 8;
    const size_t m_rows = kGemm1 ? 2 * size_t(p.n_out) : size_t(p.n_out);
    constexpr int kBPasses = kBN / 16;
    int it = 0;  // stage uses so far
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const int mb = item % m_blocks, row0 = (item / m_blocks) * kBN;
      const int row = moe_wgmma::weight_row<kGemm1, kBM>(p, mb, r0);
      const uint8_t* a0 =
          static_cast<const uint8_t*>(p.weights) +
          (size_t(expert_of(item / m_blocks)) * m_rows * K + size_t(row) * K + kc * 8) * 2;
      const size_t a_step =
          size_t(moe_wgmma::weight_row<kGemm1, kBM>(p, mb, r0 + 16) - row) * K * 2;
      const __nv_bfloat16* b_src[kBPasses];
      const uint32_t b_valid = moe_wgmma::token_sources<kGemm1>(p, row0, r0, kc, narrow, b_src);
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int s = ring.wait_empty(it);
        const uint32_t a = stage(s), b = a + kABytes;
        // Rows r0 + 16j share their swizzle (16j is a multiple of 8): 2 KB apart in the tile.
        const uint32_t a_dst = a + wgmma::sw128_offset(r0, kc, kBM);
        const uint8_t* a_src = a0 + size_t(kt) * kBK * 2;
#pragma unroll 4
        for (int j = 0; j < kBM / 16; ++j, a_src += a_step)
          cp_async_16(a_dst + j * 16 * 128, a_src, true);
#pragma unroll
        for (int j = 0; j < kBPasses; ++j)
          cp_async_16(b + wgmma::sw128_offset(r0 + 16 * j, kc, kBN), b_src[j] + kt * kBK,
                      (b_valid >> j) & 1);
        mbarrier::arrive_on_cp_async(ring.full(s));
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // leave nothing in flight
    return;
  }

  wgmma::claim_registers<kConsumerRegs>();
  if constexpr (!kGemm1) pdl_wait();  // before writing y (pdl.cuh contract)
  const int c = wg - 1, lane = tid & 31, wq = (tid / 32) & 3;
  const bool releaser = (tid & 127) == 0;  // arrives on `empty` for its warpgroup
  int it = 0;
  // One item at token width kN (a straight run of wgmma per width, so ptxas keeps them async).
  auto run_item = [&](auto width, int item) {
    constexpr int kN = decltype(width)::value;
    float acc[kMb][kBN / 8][4];
#pragma unroll
    for (int mb = 0; mb < kMb; ++mb)
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
        acc[mb][j][0] = acc[mb][j][1] = acc[mb][j][2] = acc[mb][j][3] = 0.0f;
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const int s = ring.wait_full(it);
      wgmma::fence_proxy_async();  // the producer's cp.async writes, seen through the async proxy
      const uint32_t a = stage(s) + c * kMb * 64 * 128, b = stage(s) + kABytes;
      moe_wgmma::mma_stage<kMb, kN>(acc, a, b);
      wgmma::wait<1>();  // the previous stage's wgmma are done: hand its slot back
      if (kt > 0 && releaser) mbarrier::arrive(ring.empty((it - 1) % kStages));
    }
    wgmma::wait<0>();
#pragma unroll
    for (int mb = 0; mb < kMb; ++mb) wgmma::fence_operand(acc[mb]);
    // The item's last stage, so that the producer fills the next item's stages during the
    // epilogue.
    if (releaser) mbarrier::arrive(ring.empty((it - 1) % kStages));
    moe_wgmma::store_tile<kGemm1, kBM, kMb, kN>(p, acc, item % m_blocks, (item / m_blocks) * kBN,
                                                kMb * c, wq, lane);
  };
  for (int item = blockIdx.x; item < items; item += gridDim.x)
    moe_wgmma::with_tile_width(p, (item / m_blocks) * kBN, narrow,
                               [&](auto width) { run_item(width, item); });
}

}  // namespace

bool moe_narrow_tiles(const MoeGemmParams& p) {
  static const bool on = [] {
    const char* env = std::getenv("SERVAL_MOE_NARROW_TILES");
    return env == nullptr || std::string(env) != "0";
  }();
  return on && p.permuted_to_token != nullptr;
}

bool moe_grouped_gemm_wgmma_ws(const MoeGemmParams& p, cudaStream_t stream) {
  if (p.n_out % (p.gemm1 ? kBM / 2 : kBM) != 0) return false;
  auto kernel = p.gemm1 ? moe_gemm_ws_kernel<true> : moe_gemm_ws_kernel<false>;
  allow_dynamic_smem(kernel, kSmemBytes, "moe_gemm_wgmma_ws");
  const int m_blocks = p.gemm1 ? p.n_out / (kBM / 2) : p.n_out / kBM;
  // Persistent: one CTA per SM (its shared memory allows no second) walking the items, so that
  // a CTA's epilogue overlaps the loads of its next item; SERVAL_MOE_WS_PERSISTENT=0 launches one
  // CTA per item (comparisons).
  static const bool persistent = [] {
    const char* env = std::getenv("SERVAL_MOE_WS_PERSISTENT");
    return env == nullptr || std::string(env) != "0";
  }();
  const int64_t all = int64_t(m_blocks) * p.max_tiles;
  const int ctas = int(persistent ? std::min<int64_t>(all, sm_count()) : all);
  launch_pdl(p.gemm1 ? "moe_gemm1_wgmma_ws" : "moe_gemm2_wgmma_ws", kernel, dim3(ctas),
             dim3(kThreads), kSmemBytes, stream, p, m_blocks, moe_narrow_tiles(p));
  return true;
}

}  // namespace serval::kernels::cuda
