#include "backend/cuda/cuda_mla_call.h"

#include <string>

#include "backend/cuda/tensor_data.h"
#include "base/error.h"
#include "kernels/cuda/attention/mla_attention.h"

namespace serval::backend::cuda {

void run_mla_attention(Backend& b, const Tensor& q, const Tensor& q_lat, const Tensor& kv,
                       const MlaParams& a, KvCacheLayer& cache, const StepMetadata& meta,
                       Tensor& out, cudaStream_t stream) {
  expect(q, DType::kBF16, "mla_attention q");
  expect(q_lat, DType::kBF16, "mla_attention q_lat");
  expect(kv, DType::kBF16, "mla_attention kv");
  expect(out, DType::kBF16, "mla_attention output");
  if (!a.kv_norm || !a.inv_freq)
    throw InvalidArgument("cuda backend: mla_attention needs kv_norm and inv_freq");
  expect(*a.kv_norm, DType::kBF16, "mla_attention kv_norm");
  expect(*a.inv_freq, DType::kF32, "mla_attention inv_freq");
  const int64_t T = q.dim(0), H = a.num_heads, L = a.latent_dim, R = a.rope_dim;
  auto shape_error = [&](const char* what, const Tensor& t, int64_t want) {
    return InvalidArgument("cuda backend: mla_attention " + std::string(what) + " " +
                           shape_str(t.shape) + " has " + std::to_string(t.numel()) +
                           " elements, expected " + std::to_string(want));
  };
  if (q.numel() != T * H * a.q_stride) throw shape_error("q", q, T * H * a.q_stride);
  if (q_lat.numel() != T * H * L) throw shape_error("q_lat", q_lat, T * H * L);
  if (kv.numel() != T * (L + R)) throw shape_error("kv", kv, T * (L + R));
  if (out.numel() != T * H * L) throw shape_error("output", out, T * H * L);
  if (a.kv_norm->numel() != L) throw shape_error("kv_norm", *a.kv_norm, L);
  if (a.inv_freq->numel() != R / 2) throw shape_error("inv_freq", *a.inv_freq, R / 2);
  if (cache.k.shape.size() != 4 || cache.k.dim(2) != 1 || cache.k.dim(3) != L + R ||
      cache.k.dim(1) != cache.block_size)
    throw InvalidArgument("cuda backend: mla_attention cache " + shape_str(cache.k.shape) +
                          " is not [num_blocks, " + std::to_string(cache.block_size) + ", 1, " +
                          std::to_string(L + R) + "]");
  if (T == 0) return;
  Tensor q_pe = b.empty(DType::kBF16, {T, H, R});

  kernels::cuda::MlaPrepareParams prep{};
  prep.q = bf(q);
  prep.kv = bf(kv);
  prep.kv_norm = bf(*a.kv_norm);
  prep.positions = meta.positions.as<int32_t>();
  prep.slot_mapping = meta.slot_mapping.as<int32_t>();
  prep.inv_freq = a.inv_freq->as<float>();
  prep.q_pe = bf_mut(q_pe);
  prep.cache = cache.k.data;
  prep.cache_dtype = cache.k.dtype;
  prep.k_scale = cache.k_scale;
  prep.num_tokens = int(T);
  prep.num_heads = a.num_heads;
  prep.latent_dim = a.latent_dim;
  prep.rope_dim = a.rope_dim;
  prep.q_stride = a.q_stride;
  prep.q_rope_offset = a.q_rope_offset;
  prep.eps = a.rms_norm_eps;
  prep.rope_scale = a.rope_scale;
  prep.rope_interleaved = a.rope_interleaved;
  kernels::cuda::mla_prepare(prep, stream);

  kernels::cuda::MlaAttentionParams p{};
  p.q_lat = bf(q_lat);
  p.q_pe = bf(q_pe);
  p.cache = cache.k.data;
  p.cache_dtype = cache.k.dtype;
  p.out = bf_mut(out);
  p.query_start = meta.query_start.as<int32_t>();
  p.context_lens = meta.context_lens.as<int32_t>();
  p.block_tables = meta.block_tables.as<int32_t>();
  p.num_tokens = int(T);
  p.num_seqs = meta.num_seqs;
  p.max_blocks_per_seq = meta.max_blocks_per_seq;
  p.block_size = cache.block_size;
  p.num_heads = a.num_heads;
  p.latent_dim = a.latent_dim;
  p.rope_dim = a.rope_dim;
  p.max_context_len = meta.max_context_len;
  p.scale = a.scale * cache.k_scale;
  p.v_scale = cache.k_scale;
  const size_t ws = kernels::cuda::mla_attention_workspace_bytes(int(T), a.num_heads, a.latent_dim,
                                                                 meta.max_context_len);
  Tensor workspace;
  if (ws > 0) {
    workspace = b.empty(DType::kU8, {int64_t(ws)});
    p.workspace = workspace.data;
    p.workspace_bytes = ws;
  }
  kernels::cuda::mla_attention(p, stream);
}

}  // namespace serval::backend::cuda
