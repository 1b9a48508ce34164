// Split-KV decode attention (one query row per sequence). One CTA per (split, kv head, sequence)
// serves up to 16 q heads of the GQA group as the 16 mma rows, so each K/V tile is loaded once
// for the whole group. The 4 warps take 16 keys each of every 64-key tile with their own online
// softmax state and are merged through shared memory at the end. With several splits each CTA
// writes a normalized partial (o, log2-sum-exp) and merge_kernel combines them.
// fp8 caches: each warp converts its own 16 staged key rows of K and V to f16 (no CTA barrier).
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/misc/device_utils.cuh"

namespace serval::kernels::cuda {
namespace {

using namespace attn;
constexpr int kMinChunk = 256;  // keys per split at least (also in paged_attention.cu)
constexpr int kWarps = kThreads / 32;

template <int D, DType C>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ out,
                  const unsigned char* __restrict__ k_cache,
                  const unsigned char* __restrict__ v_cache,
                  const int32_t* __restrict__ query_start, const int32_t* __restrict__ context_lens,
                  const int32_t* __restrict__ block_tables, int max_blocks_per_seq, int block_size,
                  int num_q_heads, int num_kv_heads, float scale_log2, float v_scale,
                  int num_splits, float* __restrict__ o_part, float* __restrict__ lse_part) {
  using L = TileShape<D, C>;
  constexpr bool kF16 = L::kFp8;                             // fp8 caches run the mma in f16
  extern __shared__ __align__(16) unsigned char smem_raw[];  // see TileShape
  auto stage = [&](int s) { return smem_raw + s * 2 * L::kStageTileBytes; };
  __shared__ float warp_m[kWarps][16], warp_l[kWarps][16];

  const int seq = blockIdx.z, split = blockIdx.x;
  const int group = num_q_heads / num_kv_heads;
  const int sub_groups = (group + 15) / 16;
  const int kv_head = blockIdx.y / sub_groups;
  const int head0 = kv_head * group + (blockIdx.y % sub_groups) * 16;  // q head of mma row 0
  const int num_rows = min(16, kv_head * group + group - head0);
  const int token = query_start[seq];
  const int ctx = context_lens[seq];
  const int chunk =
      max(kMinChunk, ((ctx + num_splits - 1) / num_splits + kTileKeys - 1) / kTileKeys * kTileKeys);
  const int key_begin = split * chunk, key_end = min(ctx, key_begin + chunk);
  const int64_t part_row0 = (int64_t(seq) * num_q_heads + head0) * num_splits + split;

  if (key_begin >= key_end) {     // empty partition (CTA-uniform): neutral partial
    if (num_splits == 1) return;  // context_len 0: nothing to attend
    for (int i = threadIdx.x; i < num_rows * D; i += kThreads) {
      const int r = i / D;
      o_part[(part_row0 + int64_t(r) * num_splits) * D + i % D] = 0.0f;
      if (i % D == 0) lse_part[part_row0 + int64_t(r) * num_splits] = -INFINITY;
    }
    return;
  }
  const int num_tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;
  const int32_t* table = block_tables + int64_t(seq) * max_blocks_per_seq;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;

  uint32_t qa[D / 16][4];
  {
    auto row_ptr = [&](int r) -> const __nv_bfloat16* {
      return r < num_rows ? q + (int64_t(token) * num_q_heads + head0 + r) * D : nullptr;
    };
    load_q_frags<D, kF16>(qa, row_ptr(g), row_ptr(g + 8), c);
  }
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  load_kv_tile<D, C>(stage(0), stage(0) + L::kStageTileBytes, k_cache, v_cache, table, block_size,
                     num_kv_heads, kv_head, key_begin, key_end);
  cp_async_commit();
  for (int t = 0; t < num_tiles; ++t) {
    if (t + 1 < num_tiles) {
      unsigned char* next = stage((t + 1) & 1);
      load_kv_tile<D, C>(next, next + L::kStageTileBytes, k_cache, v_cache, table, block_size,
                         num_kv_heads, kv_head, key_begin + (t + 1) * kTileKeys, key_end);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int key0 = key_begin + t * kTileKeys + warp * 16;  // this warp's 16 keys
    if (key0 < key_end) {                                    // warp-uniform
      const unsigned char* cur = stage(t & 1);
      const uint16_t* sk;  // mma-ready K rows of this warp; V rows follow at + kTileElems
      if constexpr (L::kFp8) {
        // The f16 tiles follow the stages; this warp owns rows [16·warp, 16·warp + 16) of them.
        // Rows past key_end were zero-filled: converting all 16 keeps NaN out of P·V.
        uint16_t* conv = reinterpret_cast<uint16_t*>(smem_raw + L::kStagesBytes);
        convert_tile_rows<D, C>(conv, conv + L::kTileElems, cur, cur + L::kStageTileBytes,
                                warp * 16, 16, lane, 32);
        __syncwarp();
        sk = conv + warp * 16 * L::kStride;
      } else {
        sk = reinterpret_cast<const uint16_t*>(cur) + warp * 16 * L::kStride;
      }
      float s[2][4];
      qk_scores<D, 2, kF16>(s, qa, sk, g, c);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = key0 + 8 * j + 2 * c;
        s[j][0] = key < key_end ? s[j][0] * scale_log2 : -INFINITY;
        s[j][1] = key + 1 < key_end ? s[j][1] * scale_log2 : -INFINITY;
        s[j][2] = key < key_end ? s[j][2] * scale_log2 : -INFINITY;
        s[j][3] = key + 1 < key_end ? s[j][3] * scale_log2 : -INFINITY;
      }
      online_softmax<2, D / 8>(s, m, l, o);
      pv_accumulate<D, 2, kF16>(o, s, sk + L::kTileElems, lane);
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  reduce_row_sums(l);

  // Merge the 4 warps: unnormalized o in the (now idle) KV shared memory, [warp][16][D] fp32.
  float* so = reinterpret_cast<float*>(smem_raw);
  static_assert(kWarps * 16 * D * sizeof(float) <= L::kSmemBytes);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = n * 8 + 2 * c;
    so[(warp * 16 + g) * D + col] = o[n][0];
    so[(warp * 16 + g) * D + col + 1] = o[n][1];
    so[(warp * 16 + g + 8) * D + col] = o[n][2];
    so[(warp * 16 + g + 8) * D + col + 1] = o[n][3];
  }
  if (c == 0) {
    warp_m[warp][g] = m[0];
    warp_m[warp][g + 8] = m[1];
    warp_l[warp][g] = l[0];
    warp_l[warp][g + 8] = l[1];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < num_rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_m[w][r]);
    float sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (warp_m[w][r] == -INFINITY) continue;  // warp saw no key of this partition
      const float f = exp2f(warp_m[w][r] - mx);
      sum += warp_l[w][r] * f;
      acc += so[(w * 16 + r) * D + d] * f;
    }
    if (num_splits == 1) {
      out[(int64_t(token) * num_q_heads + head0 + r) * D + d] =
          __float2bfloat16(acc / sum * v_scale);
    } else {
      o_part[(part_row0 + int64_t(r) * num_splits) * D + d] = acc / sum;
      if (d == 0) lse_part[part_row0 + int64_t(r) * num_splits] = mx + __log2f(sum);
    }
  }
}

// out[token(s), h] = Σ_i 2^(lse_i − max) · o_i / Σ_i 2^(lse_i − max), · v_scale. Block: D threads.
__global__ void merge_kernel(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                             const int32_t* __restrict__ query_start, __nv_bfloat16* out,
                             int num_q_heads, int num_splits, int head_dim, float v_scale) {
  const int seq = blockIdx.y, head = blockIdx.x, d = threadIdx.x;
  const int64_t row0 = (int64_t(seq) * num_q_heads + head) * num_splits;
  float mx = -INFINITY;
  for (int i = 0; i < num_splits; ++i) mx = fmaxf(mx, lse_part[row0 + i]);
  float sum = 0.0f, acc = 0.0f;
  for (int i = 0; i < num_splits; ++i) {
    const float lse = lse_part[row0 + i];
    if (lse == -INFINITY) continue;
    const float w = exp2f(lse - mx);
    sum += w;
    acc += w * o_part[(row0 + i) * head_dim + d];
  }
  out[(int64_t(query_start[seq]) * num_q_heads + head) * head_dim + d] =
      __float2bfloat16(acc / sum * v_scale);
}

template <int D, DType C>
void launch_decode(const PagedAttentionParams& p, int num_splits, float* o_part, float* lse_part,
                   cudaStream_t stream) {
  constexpr size_t kSmem = TileShape<D, C>::kSmemBytes;
  auto kernel = decode_kernel<D, C>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
  if (e != cudaSuccess) {
    throw Error(std::string("paged_attention_decode: cannot set shared memory size: ") +
                cudaGetErrorString(e));
  }
  const int group = p.num_q_heads / p.num_kv_heads;
  const dim3 grid(unsigned(num_splits), unsigned(p.num_kv_heads * ((group + 15) / 16)),
                  unsigned(p.num_seqs));
  constexpr float kLog2e = 1.4426950408889634f;
  kernel<<<grid, kThreads, kSmem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.q), reinterpret_cast<__nv_bfloat16*>(p.out),
      static_cast<const unsigned char*>(p.k_cache), static_cast<const unsigned char*>(p.v_cache),
      p.query_start, p.context_lens, p.block_tables, p.max_blocks_per_seq, p.block_size,
      p.num_q_heads, p.num_kv_heads, p.scale * kLog2e, p.v_scale, num_splits, o_part, lse_part);
  check_launch("paged_attention_decode");
  if (num_splits > 1) {
    merge_kernel<<<dim3(unsigned(p.num_q_heads), unsigned(p.num_seqs)), D, 0, stream>>>(
        o_part, lse_part, p.query_start, reinterpret_cast<__nv_bfloat16*>(p.out), p.num_q_heads,
        num_splits, D, p.v_scale);
    check_launch("paged_attention_merge");
  }
}

// fp8 caches are built for head_dim 64 and 128 only (paged_attention() rejects the rest).
template <int D>
void dispatch_decode(const PagedAttentionParams& p, int num_splits, float* o_part, float* lse_part,
                     cudaStream_t stream) {
  switch (p.cache_dtype) {
    case DType::kBF16:
      return launch_decode<D, DType::kBF16>(p, num_splits, o_part, lse_part, stream);
    case DType::kF8E4M3:
      if constexpr (D >= 64)
        return launch_decode<D, DType::kF8E4M3>(p, num_splits, o_part, lse_part, stream);
      break;
    case DType::kF8E5M2:
      if constexpr (D >= 64)
        return launch_decode<D, DType::kF8E5M2>(p, num_splits, o_part, lse_part, stream);
      break;
    default:
      break;
  }
  throw InvalidArgument("paged_attention: no decode kernel for a " +
                        std::string(dtype_name(p.cache_dtype)) + " KV cache with head_dim " +
                        std::to_string(D));
}

}  // namespace

void paged_attention_decode(const PagedAttentionParams& p, int num_splits, float* o_part,
                            float* lse_part, cudaStream_t stream) {
  switch (p.head_dim) {
    case 16:
      return dispatch_decode<16>(p, num_splits, o_part, lse_part, stream);
    case 32:
      return dispatch_decode<32>(p, num_splits, o_part, lse_part, stream);
    case 64:
      return dispatch_decode<64>(p, num_splits, o_part, lse_part, stream);
    case 128:
      return dispatch_decode<128>(p, num_splits, o_part, lse_part, stream);
    default:
      throw InvalidArgument("paged_attention: unsupported head_dim " + std::to_string(p.head_dim));
  }
}

}  // namespace serval::kernels::cuda
