// MLA pre-processing and attention (mla_attention.h) in CUDA cores.
//
// Attention: one CTA per (query token, group of up to 16 heads, key split); each warp owns 4
// heads. The CTA streams its keys' cache rows through shared memory in tiles of 32 rows (two
// stages, cp.async of the raw bf16 / fp8 bytes), so each row is read from memory once for all
// its heads. A lane owns the row pairs (2i, 2i+1) for i = lane + 32·j of the latent part and pair
// lane of the rope part; it holds those pairs of its warp's 4 queries (pre-scaled by scale·log2 e)
// and accumulates its latent pairs of the 4 heads' outputs. Scores of 8 keys × 4 heads are the
// lanes' partial dot products summed by a transposing butterfly (31 shuffles for 32 sums), after
// which lane l holds head l / 8, key l % 8; the online softmax (log2 domain) runs per tile.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/math.h"
#include "kernels/cuda/attention/mla_attention.h"
#include "kernels/cuda/misc/cp_async.cuh"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"
#include "kernels/cuda/misc/smem_opt_in.h"

namespace serval::kernels::cuda {
namespace {

constexpr int kPrepThreads = 128;
constexpr int kPrepHeadsPerCta = 16;  // q heads rotated per CTA (blockIdx.y ≥ 1)
constexpr int kMaxRopeDim = 64;
constexpr int kMaxLatentDim = 512;

constexpr int kTileKeys = 32;  // cache rows per shared-memory stage
constexpr int kChunkKeys = 8;  // keys per score butterfly
constexpr int kChunks = kTileKeys / kChunkKeys;
constexpr int kHeadsPerWarp = 4;
constexpr int kMaxWarps = 4;
constexpr int kMaxHeadsPerCta = kMaxWarps * kHeadsPerWarp;
constexpr int kMaxSplits = 32;         // the merge keeps one split per lane
constexpr int kMinKeysPerSplit = 256;  // below this a split's fixed cost dominates
constexpr int kMergeWarps = 4;
static_assert(kHeadsPerWarp * kChunkKeys == 32, "a butterfly sums one (head, key) per lane");
constexpr float kLog2e = 1.4426950408889634f;

template <DType C>
constexpr int kElemBytes = C == DType::kBF16 ? 2 : 1;

template <DType C>
constexpr __nv_fp8_interpretation_t kFp8Format = C == DType::kF8E4M3 ? __NV_E4M3 : __NV_E5M2;

// Element i of a cache row of type C = v rounded to nearest even (fp8: saturating to the largest
// finite value, as the CPU's float_to_e4m3 / float_to_e5m2).
template <DType C>
__device__ __forceinline__ void store_elem(unsigned char* row, int i, float v) {
  if constexpr (C == DType::kBF16) {
    reinterpret_cast<__nv_bfloat16*>(row)[i] = __float2bfloat16_rn(v);
  } else {
    row[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kFp8Format<C>);
  }
}

// Elements (2·pair, 2·pair + 1) of a row of type C (shared memory), exactly as floats.
template <DType C>
__device__ __forceinline__ float2 load_pair(const unsigned char* row, int pair) {
  if constexpr (C == DType::kBF16) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(row + 4 * pair);
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
  } else {
    const auto w = *reinterpret_cast<const __nv_fp8x2_storage_t*>(row + 2 * pair);
    const __half2 h(__nv_cvt_fp8x2_to_halfraw2(w, kFp8Format<C>));
    return __half22float2(h);
  }
}

// Two bf16 values at p (4-byte aligned) as floats.
__device__ __forceinline__ float2 load_bf16_pair(const bf16* p) {
  const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}

__device__ __forceinline__ float bf16_value(const bf16* p) {
  return __uint_as_float(uint32_t(p->bits) << 16);
}

__device__ __forceinline__ void store_bf16(bf16* p, float v) {
  *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);
}

// Rotated pair i of the rope vector x (MlaPrepareParams' pairing), in neox order, × scale. Each
// operation rounded on its own (no contraction), as the CPU twin computes it.
__device__ __forceinline__ float2 rotate_pair(const bf16* x, int i, int half, bool interleaved,
                                              float cos_a, float sin_a, float scale) {
  const float a = bf16_value(x + (interleaved ? 2 * i : i));
  const float b = bf16_value(x + (interleaved ? 2 * i + 1 : i + half));
  const float lo = __fsub_rn(__fmul_rn(a, cos_a), __fmul_rn(b, sin_a));
  const float hi = __fadd_rn(__fmul_rn(b, cos_a), __fmul_rn(a, sin_a));
  return make_float2(__fmul_rn(lo, scale), __fmul_rn(hi, scale));
}

// Grid (num_tokens, 1 + ceil(num_heads / kPrepHeadsPerCta)): blockIdx.y 0 writes token t's cache
// row, the others rotate kPrepHeadsPerCta q heads each.
template <DType C>
__global__ void __launch_bounds__(kPrepThreads)
    mla_prepare_kernel(const MlaPrepareParams p, float inv_k_scale) {
  __shared__ float s_cos[kMaxRopeDim / 2], s_sin[kMaxRopeDim / 2], scratch[32];
  const int t = blockIdx.x, tid = threadIdx.x;
  const int L = p.latent_dim, R = p.rope_dim, half = R / 2;
  // inv_freq is a weight (constant during a step): read before the wait.
  const float freq = tid < half ? p.inv_freq[tid] : 0.0f;
  pdl_wait();
  pdl_launch_dependents();
  if (tid < half) {
    float sin_a, cos_a;
    sincosf(__fmul_rn(float(p.positions[t]), freq), &sin_a, &cos_a);
    s_cos[tid] = cos_a;
    s_sin[tid] = sin_a;
  }
  __syncthreads();

  if (blockIdx.y > 0) {
    const int h0 = (int(blockIdx.y) - 1) * kPrepHeadsPerCta;
    const int heads = min(kPrepHeadsPerCta, p.num_heads - h0);
    for (int item = tid; item < heads * half; item += kPrepThreads) {
      const int h = h0 + item / half, i = item % half;
      const int64_t th = int64_t(t) * p.num_heads + h;
      const float2 r = rotate_pair(p.q + th * p.q_stride + p.q_rope_offset, i, half,
                                   p.rope_interleaved, s_cos[i], s_sin[i], p.rope_scale);
      store_bf16(p.q_pe + th * R + i, r.x);
      store_bf16(p.q_pe + th * R + i + half, r.y);
    }
    return;
  }

  const int32_t slot = p.slot_mapping[t];
  if (slot < 0) return;  // padding token (uniform over the CTA)
  const bf16* kv = p.kv + int64_t(t) * (L + R);
  float sum_sq = 0.0f;
  for (int i = tid; i < L; i += kPrepThreads) {
    const float x = bf16_value(kv + i);
    sum_sq = __fadd_rn(sum_sq, __fmul_rn(x, x));
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, float(L)), p.eps)));
  unsigned char* row =
      static_cast<unsigned char*>(p.cache) + int64_t(slot) * (L + R) * kElemBytes<C>;
  for (int i = tid; i < L; i += kPrepThreads) {
    const float c = __fmul_rn(__fmul_rn(bf16_value(kv + i), inv), bf16_value(p.kv_norm + i));
    store_elem<C>(row, i, __fmul_rn(c, inv_k_scale));
  }
  for (int i = tid; i < half; i += kPrepThreads) {
    const float2 r =
        rotate_pair(kv + L, i, half, p.rope_interleaved, s_cos[i], s_sin[i], p.rope_scale);
    store_elem<C>(row, L + i, __fmul_rn(r.x, inv_k_scale));
    store_elem<C>(row, L + i + half, __fmul_rn(r.y, inv_k_scale));
  }
}

// 4 bytes global → shared; valid == false zero-fills and reads nothing (cp.async.ca: .cg takes
// 16-byte copies only).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem),
               "r"(valid ? 4 : 0)
               : "memory");
}

// One step of the transposing butterfly: lanes with bit W set keep the upper W of their first 2W
// values, the others the lower W, each adding its partner's copy of the values it keeps.
template <int W>
__device__ __forceinline__ void butterfly_step(float (&v)[32], int lane) {
  const bool upper = (lane & W) != 0;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const float send = upper ? v[i] : v[i + W];
    const float keep = upper ? v[i + W] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, W);
  }
}

// Σ over the warp's lanes of v[lane]: lane l gets the warp-wide sum of every lane's v[l].
__device__ __forceinline__ float transpose_sum(float (&v)[32], int lane) {
  butterfly_step<16>(v, lane);
  butterfly_step<8>(v, lane);
  butterfly_step<4>(v, lane);
  butterfly_step<2>(v, lane);
  butterfly_step<1>(v, lane);
  return v[0];
}

// Grid (num_tokens, head groups, splits), blockDim.x = 32 · warps (≤ kMaxWarps); kLatPairs ≥
// latent_dim / 64 (latent pairs per lane). Dynamic shared memory: 2 stages of kTileKeys rows.
// copy_bytes: 16 when a row is a whole number of 16-byte chunks, else 4.
template <int kLatPairs, DType C>
__global__ void __launch_bounds__(kMaxWarps * 32, 2)
    mla_attention_kernel(const MlaAttentionParams p, int copy_bytes) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  const int t = blockIdx.x, split = blockIdx.z, num_splits = gridDim.z;
  const int H = p.num_heads, L = p.latent_dim, R = p.rope_dim;
  const int lat_pairs = L / 2, rope_pairs = R / 2;
  const int row_bytes = (L + R) * kElemBytes<C>;
  const int tile_bytes = kTileKeys * row_bytes;
  const int head0 = (int(blockIdx.y) * num_warps + warp) * kHeadsPerWarp;

  pdl_wait();
  pdl_launch_dependents();

  // The token's sequence (binary search: query_start[s] ≤ t < query_start[s + 1]), its keys, and
  // this CTA's share of them, [key_begin, key_end), whole tiles apart.
  int num_keys = 0;
  const int32_t* table = p.block_tables;
  if (t < p.query_start[p.num_seqs]) {
    int lo = 0, hi = p.num_seqs;
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (p.query_start[mid] <= t) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const int q_begin = p.query_start[lo], q_len = p.query_start[lo + 1] - q_begin;
    num_keys = max(0, p.context_lens[lo] - q_len + (t - q_begin) + 1);
    table += int64_t(lo) * p.max_blocks_per_seq;
  }
  const int per_split = (num_keys + num_splits - 1) / num_splits;
  const int split_keys = (per_split + kTileKeys - 1) / kTileKeys * kTileKeys;
  const int key_begin = min(num_keys, split * split_keys);
  const int key_end = min(num_keys, key_begin + split_keys);
  const int num_tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;

  // This lane's pairs of its warp's 4 queries, times scale · log2 e (0 past num_heads).
  float q[kHeadsPerWarp][kLatPairs + 1][2];
  const float q_scale = p.scale * kLog2e;
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    const int head = head0 + h;
    const int64_t th = int64_t(t) * H + head;
#pragma unroll
    for (int i = 0; i <= kLatPairs; ++i) {
      const int pair = i < kLatPairs ? lane + 32 * i : lane;
      const bool ok = head < H && (i < kLatPairs ? pair < lat_pairs : pair < rope_pairs);
      const float2 v = !ok             ? make_float2(0.0f, 0.0f)
                       : i < kLatPairs ? load_bf16_pair(p.q_lat + th * L + 2 * pair)
                                       : load_bf16_pair(p.q_pe + th * R + 2 * pair);
      q[h][i][0] = v.x * q_scale;
      q[h][i][1] = v.y * q_scale;
    }
  }

  const auto* cache = static_cast<const unsigned char*>(p.cache);
  // cp.async of tile `tile` of this CTA's keys into stage `stage`; rows past key_end zero-filled
  // (their probabilities are 0, and 0 · 0 keeps the accumulators finite).
  auto issue = [&](int tile, int stage) {
    unsigned char* dst = smem + stage * tile_bytes;
    const int key0 = key_begin + tile * kTileKeys;
    for (int r = warp; r < kTileKeys; r += num_warps) {
      const int key = key0 + r;
      const bool valid = key < key_end;
      int64_t slot = 0;
      if (valid) {
        const int block = key / p.block_size;
        slot = int64_t(table[block]) * p.block_size + (key - block * p.block_size);
      }
      const unsigned char* src = cache + slot * row_bytes;
      unsigned char* row = dst + r * row_bytes;
      if (copy_bytes == 16) {
        for (int c = lane * 16; c < row_bytes; c += 32 * 16) cp_async_16(row + c, src + c, valid);
      } else {
        for (int c = lane * 4; c < row_bytes; c += 32 * 4) cp_async_4(row + c, src + c, valid);
      }
    }
    cp_async_commit();
  };

  // Head lane / 8 of the warp: running max (log2 units) and this lane's part of the sum.
  float m = -INFINITY, l = 0.0f;
  float acc[kHeadsPerWarp][kLatPairs][2];
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h)
#pragma unroll
    for (int i = 0; i < kLatPairs; ++i) acc[h][i][0] = acc[h][i][1] = 0.0f;

  if (num_tiles > 0) issue(0, 0);
  for (int it = 0; it < num_tiles; ++it) {
    if (it + 1 < num_tiles) {
      issue(it + 1, (it + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const unsigned char* tile = smem + (it & 1) * tile_bytes;
    const int key0 = key_begin + it * kTileKeys;

    // s[c]: score of head lane / 8, key key0 + 8c + lane % 8 (log2 units; −inf past key_end).
    float s[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float part[32];  // [head · 8 + key]: this lane's share of the dot products
#pragma unroll
      for (int k = 0; k < 32; ++k) part[k] = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunkKeys; ++j) {
        const unsigned char* row = tile + (c * kChunkKeys + j) * row_bytes;
#pragma unroll
        for (int i = 0; i <= kLatPairs; ++i) {
          const int pair = i < kLatPairs ? lane + 32 * i : lat_pairs + lane;
          const bool ok = i < kLatPairs ? lane + 32 * i < lat_pairs : lane < rope_pairs;
          if (ok) {
            const float2 v = load_pair<C>(row, pair);
#pragma unroll
            for (int h = 0; h < kHeadsPerWarp; ++h) {
              float& d = part[h * kChunkKeys + j];
              d = fmaf(q[h][i][0], v.x, fmaf(q[h][i][1], v.y, d));
            }
          }
        }
      }
      s[c] = transpose_sum(part, lane);
      if (key0 + c * kChunkKeys + (lane & 7) >= key_end) s[c] = -INFINITY;
    }

    // Online softmax of the tile: the 8 lanes of a head share its max.
    float mx = s[0];
#pragma unroll
    for (int c = 1; c < kChunks; ++c) mx = fmaxf(mx, s[c]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    const float m_new = fmaxf(m, mx);
    const float base = m_new == -INFINITY ? 0.0f : m_new;  // never (−inf) − (−inf)
    const float corr = exp2f(m - base);                    // m = −inf: 0
    m = m_new;
    l *= corr;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      s[c] = exp2f(s[c] - base);
      l += s[c];
    }
#pragma unroll
    for (int h = 0; h < kHeadsPerWarp; ++h) {
      const float ch = __shfl_sync(0xffffffffu, corr, h * kChunkKeys);
#pragma unroll
      for (int i = 0; i < kLatPairs; ++i) {
        acc[h][i][0] *= ch;
        acc[h][i][1] *= ch;
      }
    }

    // acc += P · C over the tile's rows.
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int j = 0; j < kChunkKeys; ++j) {
        float ph[kHeadsPerWarp];
#pragma unroll
        for (int h = 0; h < kHeadsPerWarp; ++h)
          ph[h] = __shfl_sync(0xffffffffu, s[c], h * kChunkKeys + j);
        const unsigned char* row = tile + (c * kChunkKeys + j) * row_bytes;
#pragma unroll
        for (int i = 0; i < kLatPairs; ++i) {
          if (lane + 32 * i < lat_pairs) {
            const float2 v = load_pair<C>(row, lane + 32 * i);
#pragma unroll
            for (int h = 0; h < kHeadsPerWarp; ++h) {
              acc[h][i][0] = fmaf(ph[h], v.x, acc[h][i][0]);
              acc[h][i][1] = fmaf(ph[h], v.y, acc[h][i][1]);
            }
          }
        }
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's issue
  }

  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  l += __shfl_xor_sync(0xffffffffu, l, 4);
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    const float lh = __shfl_sync(0xffffffffu, l, h * kChunkKeys);
    const float mh = __shfl_sync(0xffffffffu, m, h * kChunkKeys);
    const int head = head0 + h;
    if (head >= H) continue;  // uniform over the warp
    const int64_t th = int64_t(t) * H + head;
    if (num_splits == 1) {
      const float inv = lh > 0.0f ? p.v_scale / lh : 0.0f;
#pragma unroll
      for (int i = 0; i < kLatPairs; ++i) {
        const int pair = lane + 32 * i;
        if (pair < lat_pairs)
          *reinterpret_cast<__nv_bfloat162*>(p.out + th * L + 2 * pair) =
              __floats2bfloat162_rn(acc[h][i][0] * inv, acc[h][i][1] * inv);
      }
    } else {
      auto* ws_acc = static_cast<float*>(p.workspace);                     // [T, H, splits, L]
      float* ws_ml = ws_acc + int64_t(p.num_tokens) * H * num_splits * L;  // [T, H, splits, 2]
      const int64_t part = th * num_splits + split;
#pragma unroll
      for (int i = 0; i < kLatPairs; ++i) {
        const int pair = lane + 32 * i;
        if (pair < lat_pairs)
          *reinterpret_cast<float2*>(ws_acc + part * L + 2 * pair) =
              make_float2(acc[h][i][0], acc[h][i][1]);
      }
      if (lane == 0) {
        ws_ml[2 * part] = mh;
        ws_ml[2 * part + 1] = lh;
      }
    }
  }
}

// out[t, h] = Σ_z 2^(m_z − M) · acc_z / Σ_z 2^(m_z − M) · l_z · v_scale over the splits z of
// (t, h) (M their largest max; a split without keys has m = −inf, l = 0). One warp per (t, h).
__global__ void __launch_bounds__(kMergeWarps * 32)
    mla_merge_kernel(const float* __restrict__ ws, bf16* __restrict__ out, int num_items,
                     int latent_dim, int num_splits, float v_scale) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int item = int(blockIdx.x) * kMergeWarps + (threadIdx.x >> 5);
  if (item >= num_items) return;  // uniform over the warp
  const float* acc = ws + int64_t(item) * num_splits * latent_dim;
  const float* ml =
      ws + int64_t(num_items) * num_splits * latent_dim + int64_t(item) * num_splits * 2;
  const float mz = lane < num_splits ? ml[2 * lane] : -INFINITY;
  const float lz = lane < num_splits ? ml[2 * lane + 1] : 0.0f;
  float big = mz;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, o));
  const float w = mz == -INFINITY ? 0.0f : exp2f(mz - big);
  const float denom = warp_sum(w * lz);
  const float inv = denom > 0.0f ? v_scale / denom : 0.0f;
  const int pairs = latent_dim / 2;
  for (int base = 0; base < pairs; base += 32) {
    const int pair = base + lane;
    float x = 0.0f, y = 0.0f;
    for (int z = 0; z < num_splits; ++z) {
      const float wz = __shfl_sync(0xffffffffu, w, z);
      if (pair < pairs && wz != 0.0f) {
        const float2 a = *reinterpret_cast<const float2*>(acc + int64_t(z) * latent_dim + 2 * pair);
        x = fmaf(wz, a.x, x);
        y = fmaf(wz, a.y, y);
      }
    }
    if (pair < pairs)
      *reinterpret_cast<__nv_bfloat162*>(out + int64_t(item) * latent_dim + 2 * pair) =
          __floats2bfloat162_rn(x * inv, y * inv);
  }
}

void check_cache_dtype(DType t, const char* who) {
  if (t != DType::kBF16 && t != DType::kF8E4M3 && t != DType::kF8E5M2)
    throw InvalidArgument(std::string(who) + ": KV cache dtype " + std::string(dtype_name(t)) +
                          " unsupported (bf16, fp8 e4m3 or fp8 e5m2)");
}

void check_dims(int latent_dim, int rope_dim, const char* who) {
  if (latent_dim <= 0 || latent_dim % 2 != 0 || latent_dim > kMaxLatentDim || rope_dim <= 0 ||
      rope_dim % 2 != 0 || rope_dim > kMaxRopeDim)
    throw InvalidArgument(std::string(who) + ": latent_dim " + std::to_string(latent_dim) +
                          " and rope_dim " + std::to_string(rope_dim) + " must be even, at most " +
                          std::to_string(kMaxLatentDim) + " and " + std::to_string(kMaxRopeDim));
}

template <int kLatPairs>
void launch_attention(const MlaAttentionParams& p, int splits, cudaStream_t stream) {
  const int elem_bytes = p.cache_dtype == DType::kBF16 ? 2 : 1;
  const int row_bytes = (p.latent_dim + p.rope_dim) * elem_bytes;
  const int copy_bytes = row_bytes % 16 == 0 ? 16 : 4;
  const size_t smem = size_t(2) * kTileKeys * row_bytes;
  const int warps = std::min(kMaxWarps, ceil_div(p.num_heads, kHeadsPerWarp));
  const dim3 grid(unsigned(p.num_tokens), unsigned(ceil_div(p.num_heads, warps * kHeadsPerWarp)),
                  unsigned(splits));
  auto run = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem, "mla_attention");
    launch_pdl("mla_attention", kernel, grid, dim3(warps * 32), smem, stream, p, copy_bytes);
  };
  switch (p.cache_dtype) {
    case DType::kBF16:
      return run(mla_attention_kernel<kLatPairs, DType::kBF16>);
    case DType::kF8E4M3:
      return run(mla_attention_kernel<kLatPairs, DType::kF8E4M3>);
    case DType::kF8E5M2:
      return run(mla_attention_kernel<kLatPairs, DType::kF8E5M2>);
    default:
      check_cache_dtype(p.cache_dtype, "cuda mla_attention");
  }
}

}  // namespace

void mla_prepare(const MlaPrepareParams& p, cudaStream_t stream) {
  check_cache_dtype(p.cache_dtype, "cuda mla_prepare");
  check_dims(p.latent_dim, p.rope_dim, "cuda mla_prepare");
  if (p.q_rope_offset < 0 || p.q_rope_offset + p.rope_dim > p.q_stride)
    throw InvalidArgument("cuda mla_prepare: q_rope_offset " + std::to_string(p.q_rope_offset) +
                          " + rope_dim " + std::to_string(p.rope_dim) + " exceeds q_stride " +
                          std::to_string(p.q_stride));
  if (!(p.k_scale > 0.0f) || !std::isfinite(p.k_scale))
    throw InvalidArgument("cuda mla_prepare: k_scale " + std::to_string(p.k_scale) +
                          " must be positive and finite");
  if (p.num_heads <= 0)
    throw InvalidArgument("cuda mla_prepare: num_heads " + std::to_string(p.num_heads));
  if (p.num_tokens == 0) return;
  const dim3 grid(unsigned(p.num_tokens), unsigned(1 + ceil_div(p.num_heads, kPrepHeadsPerCta)));
  const float inv_k = 1.0f / p.k_scale;  // in fp32, as the CPU twin
  auto run = [&](auto kernel) {
    launch_pdl("mla_prepare", kernel, grid, dim3(kPrepThreads), 0, stream, p, inv_k);
  };
  switch (p.cache_dtype) {
    case DType::kBF16:
      return run(mla_prepare_kernel<DType::kBF16>);
    case DType::kF8E4M3:
      return run(mla_prepare_kernel<DType::kF8E4M3>);
    case DType::kF8E5M2:
      return run(mla_prepare_kernel<DType::kF8E5M2>);
    default:
      return;  // refused by check_cache_dtype
  }
}

int mla_attention_num_splits(int num_tokens, int num_heads, int max_context_len) {
  const int64_t ctas = int64_t(num_tokens) * ceil_div(num_heads, kMaxHeadsPerCta);
  const int64_t target = 2 * int64_t(sm_count());  // two CTAs per SM
  if (ctas <= 0 || ctas >= target || max_context_len <= kMinKeysPerSplit) return 1;
  const int64_t by_grid = ceil_div<int64_t>(target, ctas);
  const int64_t by_keys = ceil_div<int64_t>(max_context_len, kMinKeysPerSplit);
  return int(std::clamp<int64_t>(std::min(by_grid, by_keys), 1, kMaxSplits));
}

size_t mla_attention_workspace_bytes(int num_tokens, int num_heads, int latent_dim,
                                     int max_context_len) {
  const int splits = mla_attention_num_splits(num_tokens, num_heads, max_context_len);
  if (splits == 1) return 0;
  return size_t(num_tokens) * num_heads * splits * (size_t(latent_dim) + 2) * sizeof(float);
}

void mla_attention(const MlaAttentionParams& p, cudaStream_t stream) {
  check_cache_dtype(p.cache_dtype, "cuda mla_attention");
  check_dims(p.latent_dim, p.rope_dim, "cuda mla_attention");
  if (p.cache_dtype != DType::kBF16 && (p.latent_dim + p.rope_dim) % 4 != 0)
    throw InvalidArgument(
        "cuda mla_attention: an fp8 cache needs (latent_dim + rope_dim) % 4 == "
        "0, got " +
        std::to_string(p.latent_dim + p.rope_dim));
  if (!is_aligned16(p.cache) || (reinterpret_cast<uintptr_t>(p.q_lat) & 3) != 0 ||
      (reinterpret_cast<uintptr_t>(p.q_pe) & 3) != 0)
    throw InvalidArgument(
        "cuda mla_attention: the cache must be 16-byte aligned, q_lat and q_pe 4-byte aligned");
  if (p.num_heads <= 0 || p.block_size <= 0 || p.num_seqs <= 0)
    throw InvalidArgument("cuda mla_attention: num_heads " + std::to_string(p.num_heads) +
                          ", block_size " + std::to_string(p.block_size) + ", num_seqs " +
                          std::to_string(p.num_seqs) + " must be positive");
  if (p.num_tokens == 0) return;
  const int splits = mla_attention_num_splits(p.num_tokens, p.num_heads, p.max_context_len);
  const size_t need =
      mla_attention_workspace_bytes(p.num_tokens, p.num_heads, p.latent_dim, p.max_context_len);
  if (splits > 1 && (p.workspace == nullptr || p.workspace_bytes < need))
    throw InvalidArgument("cuda mla_attention: workspace of " + std::to_string(p.workspace_bytes) +
                          " bytes, " + std::to_string(need) + " needed");
  if (p.latent_dim <= 64) {
    launch_attention<1>(p, splits, stream);
  } else if (p.latent_dim <= 128) {
    launch_attention<2>(p, splits, stream);
  } else if (p.latent_dim <= 256) {
    launch_attention<4>(p, splits, stream);
  } else {
    launch_attention<8>(p, splits, stream);
  }
  if (splits > 1) {
    const int items = p.num_tokens * p.num_heads;
    launch_pdl("mla_attention merge", mla_merge_kernel,
               dim3(unsigned(ceil_div(items, kMergeWarps))), dim3(kMergeWarps * 32), 0, stream,
               static_cast<const float*>(p.workspace), p.out, items, p.latent_dim, splits,
               p.v_scale);
  }
}

}  // namespace serval::kernels::cuda
