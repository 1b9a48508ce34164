// The throughput backend's grouped GEMMs for bf16 experts on Hopper warpgroup MMA (wgmma): the
// contract of moe_gemm.h (swap-AB: weight rows × 128 permuted token rows per CTA), run by
// moe_grouped_gemm for the throughput config unless SERVAL_MOE_GEMM_MMA_SYNC=1.
//
// A CTA is two warpgroups over 256 weight rows (128 where they do not divide the output): each
// warpgroup computes its half against all 128 token rows as m64n128 accumulators, 4 wgmma k-steps
// per 64-wide K stage, both operands from shared memory (K-major, 128-byte swizzle: the
// cp.async layout of moe_gemm.cu is that swizzle already). Pipeline: 4 stages, tiles issued two
// ahead, at most two wgmma groups in flight per warpgroup, one barrier per stage.
//
// GEMM1 pairs gate and up in registers: in each 16-row warp slice, rows 0-7 are gate rows and
// rows 8-15 the up rows of the same 8 channels, so a thread's accumulator rows g and g + 8 hold
// gate and up of one (channel, token).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "kernels/cuda/misc/cp_async.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
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
constexpr int kThreads = 256, kStages = 4;
// kBM weight rows per CTA (128 or 256): warpgroup w owns rows [w·kBM/2, (w+1)·kBM/2) as kBM/128
// m64 accumulators. 256 rows halve the token-tile loads per FLOP (L2 traffic); 4 stages of
// A (kBM rows) and B (128 rows) tiles.
template <int kBM>
constexpr int kStageBytes = (kBM + kBN) * kBK * 2;
template <int kBM>
constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes<kBM> + 1024;  // + alignment slack
template <bool kGemm1, int kBM>
__global__ void __launch_bounds__(kThreads, 1) moe_gemm_wgmma_kernel(MoeGemmParams p) {
  constexpr int kMb = kBM / 128;  // m64 blocks per warpgroup
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = raw + ((1024 - (raw & 1023)) & 1023);  // swizzle atoms: 1024-aligned
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup, warp within it

  const int tile = blockIdx.y;
  const int expert = moe_tile_expert<kGemm1>(p, tile);  // the PDL protocol of both GEMMs
  if (expert < 0) return;                               // whole CTA, before any barrier

  const int K = p.k;
  const int m_rows = kGemm1 ? 2 * p.n_out : p.n_out;
  const int row0 = tile * kBN;  // first permuted row of this tile
  // Every thread copies 16-byte chunk column kc of kBM / 32 A rows and 4 B rows per stage.
  constexpr int kRowsPerPass = kThreads / 8;
  constexpr int kAChunks = kBM / kRowsPerPass, kBChunks = kBN / kRowsPerPass;
  const int kc = tid & 7;
  const uint8_t* W = static_cast<const uint8_t*>(p.weights) + size_t(expert) * m_rows * K * 2;
  const uint8_t* a_src[kAChunks];
  const __nv_bfloat16* b_src[kBChunks];
  bool b_valid[kBChunks];
#pragma unroll
  for (int j = 0; j < kAChunks; ++j) {
    const int r = tid / 8 + j * kRowsPerPass;
    a_src[j] =
        W + (size_t(moe_wgmma::weight_row<kGemm1, kBM>(p, int(blockIdx.x), r)) * K + kc * 8) * 2;
  }
  // Swizzled offset of this thread's chunk in pass j (row tid / 8 + 32j): the same in A and B.
  auto dst = [&](int j) { return wgmma::sw128_offset(tid / 8 + j * kRowsPerPass, kc, kBM); };
#pragma unroll
  for (int j = 0; j < kBChunks; ++j)
    b_src[j] =
        moe_wgmma::token_row<kGemm1>(p, row0, tid / 8 + j * kRowsPerPass, b_valid[j]) + kc * 8;
  auto stage_a = [&](int s) { return smem + uint32_t(s) * kStageBytes<kBM>; };
  auto stage_b = [&](int s) { return stage_a(s) + kBM * kBK * 2; };
  auto load_a = [&](int kt) {
#pragma unroll
    for (int j = 0; j < kAChunks; ++j)
      cp_async_16(stage_a(kt % kStages) + dst(j), a_src[j] + size_t(kt) * kBK * 2, true);
  };
  auto load_b = [&](int kt) {
#pragma unroll
    for (int j = 0; j < kBChunks; ++j)
      cp_async_16(stage_b(kt % kStages) + dst(j), b_src[j] + kt * kBK, b_valid[j]);
  };

  float acc[kMb][kBN / 8][4];  // wgmma accumulators: acc[mb][j][·] token rows 8j..
#pragma unroll
  for (int mb = 0; mb < kMb; ++mb)
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j)
      acc[mb][j][0] = acc[mb][j][1] = acc[mb][j][2] = acc[mb][j][3] = 0.0f;

  // Prologue: tiles 0 and 1 (weights first; GEMM2's activations only after its PDL wait). Tile
  // kt is then issued at stage kt − 2, into the slot whose last reader (tile kt − 4) every
  // warpgroup waited for before that stage's barrier.
  constexpr int kAhead = kStages - 2;
  const int KT = K / kBK;
#pragma unroll
  for (int s = 0; s < kAhead; ++s)
    if (s < KT) load_a(s);
  if constexpr (!kGemm1) {
    pdl_wait();  // GEMM1's act is complete from here on
    pdl_launch_dependents();
  }
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < KT) load_b(s);
    cp_async_commit();
  }

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kAhead - 1>();  // tile kt has landed (this thread's copies)
    wgmma::fence_proxy_async();   // ... visible to wgmma
    __syncthreads();              // ... everyone's; tile kt − 2's wgmma are complete
    if (kt + kAhead < KT) {
      load_a(kt + kAhead);
      load_b(kt + kAhead);
    }
    cp_async_commit();
    // This warpgroup's m64 block mb: A rows (kMb·wg + mb)·64.., 128 bytes each.
    const uint32_t a = stage_a(kt % kStages) + wg * kMb * 64 * 128, b = stage_b(kt % kStages);
    moe_wgmma::mma_stage<kMb>(acc, a, b);
    wgmma::wait<1>();  // tile kt − 1 done: its slot is reused two stages from now
  }
  wgmma::wait<0>();
#pragma unroll
  for (int mb = 0; mb < kMb; ++mb) wgmma::fence_operand(acc[mb]);
  cp_async_wait<0>();

  moe_wgmma::store_tile<kGemm1, kBM, kMb>(p, acc, int(blockIdx.x), row0, kMb * wg, wq, lane);
}

template <int kBM>
void launch(const MoeGemmParams& p, cudaStream_t stream) {
  auto kernel = p.gemm1 ? moe_gemm_wgmma_kernel<true, kBM> : moe_gemm_wgmma_kernel<false, kBM>;
  allow_dynamic_smem(kernel, kSmemBytes<kBM>, "moe_gemm_wgmma");
  const int m_blocks = p.gemm1 ? p.n_out / (kBM / 2) : p.n_out / kBM;
  launch_pdl(p.gemm1 ? "moe_gemm1_wgmma" : "moe_gemm2_wgmma", kernel, dim3(m_blocks, p.max_tiles),
             dim3(kThreads), kSmemBytes<kBM>, stream, p);
}

}  // namespace

bool moe_grouped_gemm_wgmma(const MoeGemmParams& p, cudaStream_t stream) {
  static const bool off = std::getenv("SERVAL_MOE_GEMM_MMA_SYNC") != nullptr;
  if (off || p.config != MoeGemmConfig::kThroughput || p.tile != kBN) return false;
  if (p.format == MoeWeightFormat::kNvfp4) return moe_grouped_gemm_wgmma_nvfp4(p, stream);
  if (p.format != MoeWeightFormat::kBf16) return false;
  // The warp-specialized kernel first (SERVAL_MOE_WGMMA_WS=0: never), then 256 weight rows per
  // CTA where they divide the output (GEMM1: 128 channels), else 128 (moe_grouped_gemm checked
  // that); SERVAL_MOE_WGMMA_ROWS=128 forces 128 (comparisons).
  auto env_is = [](const char* name, const char* value) {
    const char* env = std::getenv(name);
    return env != nullptr && std::string(env) == value;
  };
  static const bool ws = !env_is("SERVAL_MOE_WGMMA_WS", "0");
  static const bool narrow = env_is("SERVAL_MOE_WGMMA_ROWS", "128");
  if (ws && !narrow && moe_grouped_gemm_wgmma_ws(p, stream)) return true;
  if (!narrow && p.n_out % (p.gemm1 ? 128 : 256) == 0) {
    launch<256>(p, stream);
  } else {
    launch<128>(p, stream);
  }
  return true;
}

}  // namespace serval::kernels::cuda
