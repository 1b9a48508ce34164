// Flash-attention prefill over the paged cache: one CTA per (sequence, 64-row query tile,
// q head); 4 warps × 16 query rows; K/V tiles of 64 keys streamed through two cp.async stages;
// S = Q·Kᵀ and O += P·V on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulators).
// fp8 caches: after a tile lands, the CTA converts all 64 staged K/V rows to f16 (one extra
// barrier) and the mma runs in f16.
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda {
namespace {

using namespace attn;
constexpr int kQTile = 64;  // query rows per CTA (16 per warp)

template <int D, DType C>
__global__ void __launch_bounds__(kThreads)
    prefill_kernel(const __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ out,
                   const unsigned char* __restrict__ k_cache,
                   const unsigned char* __restrict__ v_cache,
                   const int32_t* __restrict__ query_start,
                   const int32_t* __restrict__ context_lens,
                   const int32_t* __restrict__ block_tables, int max_blocks_per_seq, int block_size,
                   int num_q_heads, int num_kv_heads, float scale_log2, float v_scale) {
  using L = TileShape<D, C>;
  constexpr bool kF16 = L::kFp8;                             // fp8 caches run the mma in f16
  constexpr int kNt = kTileKeys / 8;                         // score n-tiles per warp per KV tile
  extern __shared__ __align__(16) unsigned char smem_raw[];  // see TileShape
  auto stage = [&](int s) { return smem_raw + s * 2 * L::kStageTileBytes; };

  const int seq = blockIdx.z, head = blockIdx.y;
  const int q_begin = query_start[seq];
  const int q_len = query_start[seq + 1] - q_begin;
  const int q0 = blockIdx.x * kQTile;
  if (q0 >= q_len) return;  // CTA-uniform
  const int ctx = context_lens[seq];
  const int prefix = ctx - q_len;  // position of query row i is prefix + i
  const int kv_head = head / (num_q_heads / num_kv_heads);
  const int rows = min(kQTile, q_len - q0);
  const int num_keys = prefix + q0 + rows;  // causal: the last row sees keys [0, num_keys)
  const int num_tiles = (num_keys + kTileKeys - 1) / kTileKeys;
  const int32_t* table = block_tables + int64_t(seq) * max_blocks_per_seq;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int wrow0 = q0 + warp * 16;        // first query row of this warp
  const bool warp_active = wrow0 < q_len;  // warp-uniform
  const int row_lo = wrow0 + g, row_hi = wrow0 + g + 8;
  // Rows past q_len compute on zero q and are never stored; clamp their positions so every row
  // keeps key 0 unmasked.
  const int pos_lo = prefix + min(row_lo, q_len - 1), pos_hi = prefix + min(row_hi, q_len - 1);
  const int warp_last_key = prefix + min(wrow0 + 15, q_len - 1);

  uint32_t qa[D / 16][4];
  {
    auto row_ptr = [&](int r) -> const __nv_bfloat16* {
      return r < q_len ? q + ((int64_t(q_begin) + r) * num_q_heads + head) * D : nullptr;
    };
    load_q_frags<D, kF16>(qa, row_ptr(row_lo), row_ptr(row_hi), c);
  }
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  load_kv_tile<D, C>(stage(0), stage(0) + L::kStageTileBytes, k_cache, v_cache, table, block_size,
                     num_kv_heads, kv_head, 0, num_keys);
  cp_async_commit();
  for (int t = 0; t < num_tiles; ++t) {
    if (t + 1 < num_tiles) {
      unsigned char* next = stage((t + 1) & 1);
      load_kv_tile<D, C>(next, next + L::kStageTileBytes, k_cache, v_cache, table, block_size,
                         num_kv_heads, kv_head, (t + 1) * kTileKeys, num_keys);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = tile t
    cp_async_wait<1>();
    __syncthreads();
    const unsigned char* cur = stage(t & 1);
    const uint16_t* sk;  // mma-ready K tile; the V tile follows at + kTileElems
    if constexpr (L::kFp8) {
      // The f16 tiles follow the stages. All 64 rows (zero-filled past num_keys) are converted so
      // masked keys multiply zeros, never stale or NaN values, in P·V.
      uint16_t* conv = reinterpret_cast<uint16_t*>(smem_raw + L::kStagesBytes);
      convert_tile_rows<D, C>(conv, conv + L::kTileElems, cur, cur + L::kStageTileBytes, 0,
                              kTileKeys, threadIdx.x, kThreads);
      __syncthreads();
      sk = conv;
    } else {
      sk = reinterpret_cast<const uint16_t*>(cur);
    }
    const int key0 = t * kTileKeys;
    if (warp_active && key0 <= warp_last_key) {
      float s[kNt][4];
      qk_scores<D, kNt, kF16>(s, qa, sk, g, c);
#pragma unroll
      for (int j = 0; j < kNt; ++j) {
        const int key = key0 + 8 * j + 2 * c;
        s[j][0] = key <= pos_lo ? s[j][0] * scale_log2 : -INFINITY;
        s[j][1] = key + 1 <= pos_lo ? s[j][1] * scale_log2 : -INFINITY;
        s[j][2] = key <= pos_hi ? s[j][2] * scale_log2 : -INFINITY;
        s[j][3] = key + 1 <= pos_hi ? s[j][3] * scale_log2 : -INFINITY;
      }
      online_softmax<kNt, D / 8>(s, m, l, o);
      pv_accumulate<D, kNt, kF16>(o, s, sk + L::kTileElems, lane);
    }
    // Stage t&1 is refilled by iteration t+1's load of tile t+2; the f16 tiles are rewritten by
    // iteration t+1's conversion.
    __syncthreads();
  }
  cp_async_wait<0>();

  reduce_row_sums(l);
  const float inv_lo = l[0] > 0.0f ? v_scale / l[0] : 0.0f;
  const float inv_hi = l[1] > 0.0f ? v_scale / l[1] : 0.0f;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = n * 8 + 2 * c;
    if (row_lo < q_len) {
      *reinterpret_cast<__nv_bfloat162*>(
          out + ((int64_t(q_begin) + row_lo) * num_q_heads + head) * D + col) =
          __floats2bfloat162_rn(o[n][0] * inv_lo, o[n][1] * inv_lo);
    }
    if (row_hi < q_len) {
      *reinterpret_cast<__nv_bfloat162*>(
          out + ((int64_t(q_begin) + row_hi) * num_q_heads + head) * D + col) =
          __floats2bfloat162_rn(o[n][2] * inv_hi, o[n][3] * inv_hi);
    }
  }
}

template <int D, DType C>
void launch_prefill(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr size_t kSmem = TileShape<D, C>::kSmemBytes;
  auto kernel = prefill_kernel<D, C>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
  if (e != cudaSuccess) {
    throw Error(std::string("paged_attention_prefill: cannot set shared memory size: ") +
                cudaGetErrorString(e));
  }
  const dim3 grid(unsigned((p.max_query_len + kQTile - 1) / kQTile), unsigned(p.num_q_heads),
                  unsigned(p.num_seqs));
  constexpr float kLog2e = 1.4426950408889634f;
  kernel<<<grid, kThreads, kSmem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<__nv_bfloat16*>(p.out),
      static_cast<const unsigned char*>(p.k_cache), static_cast<const unsigned char*>(p.v_cache),
      p.query_start, p.context_lens, p.block_tables, p.max_blocks_per_seq, p.block_size,
      p.num_q_heads, p.num_kv_heads, p.scale * kLog2e, p.v_scale);
  check_launch("paged_attention_prefill");
}

// fp8 caches are built for head_dim 64 and 128 only (paged_attention() rejects the rest).
template <int D>
void dispatch_prefill(const PagedAttentionParams& p, cudaStream_t stream) {
  switch (p.cache_dtype) {
    case DType::kBF16:
      return launch_prefill<D, DType::kBF16>(p, stream);
    case DType::kF8E4M3:
      if constexpr (D >= 64) return launch_prefill<D, DType::kF8E4M3>(p, stream);
      break;
    case DType::kF8E5M2:
      if constexpr (D >= 64) return launch_prefill<D, DType::kF8E5M2>(p, stream);
      break;
    default:
      break;
  }
  throw InvalidArgument("paged_attention: no prefill kernel for a " +
                        std::string(dtype_name(p.cache_dtype)) + " KV cache with head_dim " +
                        std::to_string(D));
}

}  // namespace

void paged_attention_prefill(const PagedAttentionParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 16:
      return dispatch_prefill<16>(p, stream);
    case 32:
      return dispatch_prefill<32>(p, stream);
    case 64:
      return dispatch_prefill<64>(p, stream);
    case 128:
      return dispatch_prefill<128>(p, stream);
    default:
      throw InvalidArgument("paged_attention: unsupported head_dim " + std::to_string(p.head_dim));
  }
}

}  // namespace serval::kernels::cuda
