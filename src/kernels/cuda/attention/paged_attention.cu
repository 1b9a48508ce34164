// Host entries of paged attention: validate the metadata, size the decode split-KV workspace and
// pick the decode or prefill path.
#include <algorithm>
#include <atomic>
#include <string>

#include "base/math.h"
#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"

namespace serval::kernels::cuda {

// Splits s = ceil(tiles / T) for T = 64-key tiles per split (cost model of attention_launch.h; the
// merge also reads rows·D fp32 per split, 1/64 of a tile per q-head row). The CTAs run in waves of
// sm_count · kDecodeCtasPerSm; every CTA of a wave streams T tiles, so a step costs about
// waves · (T + fixed) (+ the merge when s > 1: fixed + s · rows / 64). A partly filled last wave
// costs a full one: this is what makes e.g. 2 splits of 256 CTAs (1.3 waves) slower than 3 (1.94
// waves). Ties keep fewer splits. Depends only on the arguments and the SM count, so graph
// replays agree. (Sequences shorter than the bound use fewer of the splits: decode_partition.)
int paged_attention_num_splits(int num_seqs, int num_q_heads, int num_kv_heads,
                               int max_context_len) {
  if (num_seqs <= 0 || num_kv_heads <= 0) return 1;
  const int group = std::max(1, num_q_heads / num_kv_heads);
  const int64_t rows = std::min(group, 16);  // q heads per CTA
  const int64_t ctas = int64_t(num_seqs) * num_kv_heads * ceil_div(group, 16);
  const int64_t slots = int64_t(kDecodeCtasPerSm) * sm_count();
  const int64_t tiles = ceil_div<int64_t>(std::max(max_context_len, 1), kDecodeTileKeys);
  int64_t best_splits = 1, best_cost = -1;  // cost in 1/64 tile
  for (int64_t per_split = tiles; per_split >= 1; --per_split) {
    const int64_t splits = ceil_div(tiles, per_split);
    if (splits > kDecodeMaxSplits) break;
    if (ceil_div(tiles, splits) != per_split) continue;  // same splits as a larger per_split
    const int64_t waves = ceil_div(ctas * splits, slots);
    const int64_t cost = waves * (per_split + kCtaFixedTiles) * kDecodeTileKeys +
                         (splits > 1 ? kMergeTiles * kDecodeTileKeys + splits * rows : 0);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_splits = splits;
    }
  }
  return int(best_splits);
}

size_t paged_attention_workspace_bytes(int num_seqs, int num_q_heads, int num_kv_heads,
                                       int head_dim, int max_query_len, int max_context_len) {
  if (max_query_len != 1) return 0;
  const int splits =
      paged_attention_num_splits(num_seqs, num_q_heads, num_kv_heads, max_context_len);
  if (splits == 1) return 0;
  return size_t(num_seqs) * num_q_heads * splits * (head_dim + 1) * sizeof(float);
}

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw InvalidArgument("cuda paged_attention: " + what);
}

void check_params(const PagedAttentionParams& p) {
  if (p.head_dim != 16 && p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    bad("head_dim " + std::to_string(p.head_dim) + " unsupported (16, 32, 64 or 128)");
  const bool fp8 = p.cache_dtype == DType::kF8E4M3 || p.cache_dtype == DType::kF8E5M2;
  if (!fp8 && p.cache_dtype != DType::kBF16)
    bad("KV cache dtype " + std::string(dtype_name(p.cache_dtype)) +
        " unsupported (bf16, fp8 e4m3 or fp8 e5m2)");
  // The fp8 kernels are instantiated for the head dims of real models only (compile time).
  if (fp8 && p.head_dim < 64)
    bad("an fp8 KV cache needs head_dim 64 or 128, got " + std::to_string(p.head_dim));
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0)
    bad("num_q_heads " + std::to_string(p.num_q_heads) + " is not a multiple of num_kv_heads " +
        std::to_string(p.num_kv_heads));
  if (p.block_size <= 0) bad("block_size must be positive");
  if (p.max_query_len < 1) bad("max_query_len must be at least 1");
  if (!is_aligned16(p.k_cache) || !is_aligned16(p.v_cache) ||
      (reinterpret_cast<uintptr_t>(p.q) & 3u) || (reinterpret_cast<uintptr_t>(p.out) & 3u))
    bad("KV caches must be 16-byte aligned and q/out 4-byte aligned");
}

// The decode path (max_query_len 1, p checked, at least one sequence); rope_args: see
// paged_attention_decode.
void decode(const PagedAttentionParams& p, const DecodeRopeArgs* rope_args, cudaStream_t stream) {
  if (p.max_blocks_per_seq < 1)
    bad("decode needs max_blocks_per_seq ≥ 1, got " + std::to_string(p.max_blocks_per_seq));
  if (p.num_tokens != p.num_seqs)
    bad("decode (max_query_len 1) needs one token per sequence, got " +
        std::to_string(p.num_tokens) + " tokens for " + std::to_string(p.num_seqs) + " sequences");
  const int splits =
      paged_attention_num_splits(p.num_seqs, p.num_q_heads, p.num_kv_heads, p.max_context_len);
  float* o_part = nullptr;
  float* lse_part = nullptr;
  if (splits > 1) {
    const size_t need = paged_attention_workspace_bytes(p.num_seqs, p.num_q_heads, p.num_kv_heads,
                                                        p.head_dim, 1, p.max_context_len);
    if (p.workspace == nullptr || p.workspace_bytes < need)
      bad("workspace of " + std::to_string(p.workspace_bytes) + " bytes, decode needs " +
          std::to_string(need));
    if (!is_aligned16(p.workspace)) bad("the decode workspace must be 16-byte aligned");
    o_part = static_cast<float*>(p.workspace);
    lse_part = o_part + size_t(p.num_seqs) * p.num_q_heads * splits * p.head_dim;
  }
  paged_attention_decode(p, splits, o_part, lse_part, rope_args, stream);
}

}  // namespace

void paged_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  check_params(p);
  if (p.num_seqs == 0 || p.num_tokens == 0) return;
  if (p.max_query_len > 1) {
    paged_attention_prefill(p, stream);
    return;
  }
  decode(p, nullptr, stream);
}

void paged_attention_rope(const PagedAttentionParams& p, const QkNormRopeKvParams& r,
                          cudaStream_t stream) {
  check_params(p);
  check_qk_norm_rope_kv(r);
  if (p.max_query_len != 1)
    bad("paged_attention_rope is decode only (max_query_len 1), got max_query_len " +
        std::to_string(p.max_query_len));
  if (r.num_tokens != p.num_tokens || r.num_q_heads != p.num_q_heads ||
      r.num_kv_heads != p.num_kv_heads || r.head_dim != p.head_dim)
    bad("the rope parameters' shape (" + std::to_string(r.num_tokens) + " tokens, " +
        std::to_string(r.num_q_heads) + "/" + std::to_string(r.num_kv_heads) + " heads of " +
        std::to_string(r.head_dim) + ") differs from the attention's (" +
        std::to_string(p.num_tokens) + ", " + std::to_string(p.num_q_heads) + "/" +
        std::to_string(p.num_kv_heads) + ", " + std::to_string(p.head_dim) + ")");
  if (r.k_cache != p.k_cache || r.v_cache != p.v_cache || r.cache_dtype != p.cache_dtype)
    bad("the rope parameters must name the attention's caches and cache dtype");
  if (r.qkv == nullptr || r.positions == nullptr || r.inv_freq == nullptr ||
      r.slot_mapping == nullptr)
    bad("the rope parameters need qkv, positions, inv_freq and slot_mapping");
  if (p.num_seqs == 0 || p.num_tokens == 0) return;
  DecodeRopeArgs args;
  args.qkv = r.qkv;
  args.q_norm = r.q_norm;
  args.k_norm = r.k_norm;
  args.positions = r.positions;
  args.inv_freq = r.inv_freq;
  args.slot_mapping = r.slot_mapping;
  args.k_cache = static_cast<unsigned char*>(r.k_cache);
  args.v_cache = static_cast<unsigned char*>(r.v_cache);
  args.eps = r.eps;
  // The reciprocals in fp32 on the host, as qk_norm_rope_kv takes them.
  args.inv_k_scale = 1.0f / r.k_scale;
  args.inv_v_scale = 1.0f / r.v_scale;
  decode(p, &args, stream);
}

}  // namespace serval::kernels::cuda
