// One paged-attention problem of the GPU tests and benchmarks: its host inputs (PagedProblem),
// their device copies with the launch parameters (PagedDeviceProblem), the CPU twin's answer
// (paged_reference) and a whole checked case (run_paged_case: random inputs, GPU against CPU).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda_test_util.h"
#include "kernels/fp8_test_util.h"
#include "kernels/paged_layout_util.h"

namespace serval::testing {

// A checked case: per-sequence lengths, the head shape and the cache format.
struct PagedCase {
  std::vector<int> q_lens, ctx_lens;  // per sequence; ctx_len ≥ q_len (prefix = ctx − q)
  int hq, hkv, d;                     // q heads, kv heads, head dim
  DType dtype = DType::kBF16;         // cache: kBF16, kF8E4M3 or kF8E5M2
  int block_size = 16;                // tokens per cache block
  int max_context_bound = 0;          // host max_context_len; 0: the largest ctx_len
  float v_scale = 1.0f;               // bf16 only; fp8 cases derive it from the format
};

// Host inputs of one launch. The caches are raw bytes of cache_dtype (2 per bf16 element, 1 per
// fp8 code), [layout.num_blocks, layout.block_size, num_kv_heads, head_dim] each.
struct PagedProblem {
  PagedLayout layout;
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  DType cache_dtype = DType::kBF16;
  std::vector<bf16> q;        // [layout.T, num_q_heads, head_dim]
  std::vector<uint8_t> k, v;  // cache bytes, see above
  float scale = 0.0f;         // softmax scale · k_scale (the caller folds k_scale in)
  float v_scale = 1.0f;       // applied to the output (the stored v is v / v_scale)
};

// The bytes of bf16 values, as a bf16 cache holds them.
inline std::vector<uint8_t> bf16_bytes(const std::vector<bf16>& x) {
  std::vector<uint8_t> bytes(x.size() * sizeof(bf16));
  std::memcpy(bytes.data(), x.data(), bytes.size());
  return bytes;
}

// Sets the fields that the CPU (kernels::PagedAttentionParams) and the CUDA
// (kernels::cuda::PagedAttentionParams) params share, from pr; pointers and cache_dtype are the
// caller's (the CPU twin reads bf16 caches widened to f32).
template <typename Params>
void set_paged_shape(Params& p, const PagedProblem& pr) {
  p.num_seqs = int(pr.layout.ctx_lens.size());
  p.max_blocks_per_seq = pr.layout.max_blocks;
  p.block_size = pr.layout.block_size;
  p.num_q_heads = pr.num_q_heads;
  p.num_kv_heads = pr.num_kv_heads;
  p.head_dim = pr.head_dim;
  p.scale = pr.scale;
  p.v_scale = pr.v_scale;
}

// Random inputs of case c from `seed`: layout make_paged_layout(…, seed); K, V from seed + 1,
// seed + 2 (bf16 in [-1, 1), or fp8 codes whose real magnitudes are ≤ 1.5 and 2.5 through k_scale
// and v_scale); q from seed + 3 in [-2, 2). Every slot no sequence owns is 0xFF bytes (NaN in
// bf16, e4m3 and e5m2): a read past a sequence's keys shows.
inline PagedProblem make_paged_problem(const PagedCase& c, uint32_t seed) {
  PagedProblem pr;
  pr.layout = make_paged_layout(c.q_lens, c.ctx_lens, c.block_size, seed);
  pr.num_q_heads = c.hq;
  pr.num_kv_heads = c.hkv;
  pr.head_dim = c.d;
  pr.cache_dtype = c.dtype;
  const PagedLayout& l = pr.layout;
  const bool fp8 = is_fp8(c.dtype);
  const size_t kv_row = size_t(c.hkv) * c.d,
               cache_elems = size_t(l.num_blocks) * l.block_size * kv_row;
  const float k_scale = fp8 ? 1.5f / cache_max(c.dtype) : 1.0f;
  pr.v_scale = fp8 ? 2.5f / cache_max(c.dtype) : c.v_scale;
  if (fp8) {
    pr.k = random_fp8(cache_elems, c.dtype, seed + 1, k_scale);
    pr.v = random_fp8(cache_elems, c.dtype, seed + 2, pr.v_scale);
  } else {
    pr.k = bf16_bytes(random_bf16(cache_elems, seed + 1));
    pr.v = bf16_bytes(random_bf16(cache_elems, seed + 2));
  }
  const size_t row_bytes = kv_row * cache_elem_bytes(c.dtype);
  for (size_t slot = 0; slot < l.live.size(); ++slot) {
    if (l.live[slot]) continue;
    std::memset(pr.k.data() + slot * row_bytes, 0xFF, row_bytes);
    std::memset(pr.v.data() + slot * row_bytes, 0xFF, row_bytes);
  }
  pr.q = random_bf16(size_t(l.T) * c.hq * c.d, seed + 3, -2.0f, 2.0f);
  pr.scale = 1.0f / std::sqrt(float(c.d)) * k_scale;
  return pr;
}

// The CPU twin's output for pr, [layout.T, num_q_heads, head_dim] f32, on the same values: bf16
// caches widened to f32 (NaN slots stay NaN), fp8 caches read as bytes.
inline std::vector<float> paged_reference(const PagedProblem& pr) {
  const PagedLayout& l = pr.layout;
  std::vector<float> q_f = to_float(pr.q), want(pr.q.size()), k_f, v_f;
  kernels::PagedAttentionParams cp{};
  if (is_fp8(pr.cache_dtype)) {
    cp.k_cache = pr.k.data();
    cp.v_cache = pr.v.data();
    cp.cache_dtype = pr.cache_dtype;
  } else {
    const size_t cache_elems = pr.k.size() / sizeof(bf16);
    k_f.resize(cache_elems);
    v_f.resize(cache_elems);
    for (size_t i = 0; i < cache_elems; ++i) {
      k_f[i] = cache_decode(DType::kBF16, pr.k, i);
      v_f[i] = cache_decode(DType::kBF16, pr.v, i);
    }
    cp.k_cache = k_f.data();
    cp.v_cache = v_f.data();
    cp.cache_dtype = DType::kF32;
  }
  cp.q = q_f.data();
  cp.out = want.data();
  cp.query_start = l.query_start.data();
  cp.context_lens = l.ctx_lens.data();
  cp.block_tables = l.tables.data();
  set_paged_shape(cp, pr);
  kernels::cpu::paged_attention(cp);
  return want;
}

// Device copies of a PagedProblem's inputs, an output of q's size and the decode workspace
// (paged_attention_workspace_bytes(…), 0 bytes for prefill or a single split); owns them all.
// `params` is ready for kernels::cuda::paged_attention and points into these buffers, so the
// object is neither copied nor moved. bound: the host max_context_len (0: the largest context).
// Nothing is poisoned here: poison() before a checked launch.
struct PagedDeviceProblem {
  PagedDeviceProblem(const PagedProblem& pr, int bound)
      : q(pr.q),
        out(pr.q.size()),
        k(pr.k),
        v(pr.v),
        query_start(pr.layout.query_start),
        context_lens(pr.layout.ctx_lens),
        block_tables(pr.layout.tables),
        workspace(kernels::cuda::paged_attention_workspace_bytes(
            int(pr.layout.ctx_lens.size()), pr.num_q_heads, pr.num_kv_heads, pr.head_dim,
            pr.layout.max_q, bound ? bound : pr.layout.max_ctx)) {
    const PagedLayout& l = pr.layout;
    const size_t cache_bytes = size_t(l.num_blocks) * l.block_size * pr.num_kv_heads * pr.head_dim *
                               cache_elem_bytes(pr.cache_dtype);
    if (pr.k.size() != cache_bytes || pr.v.size() != cache_bytes)
      throw std::invalid_argument("PagedDeviceProblem: K/V caches of " +
                                  std::to_string(pr.k.size()) + "/" + std::to_string(pr.v.size()) +
                                  " bytes, the layout needs " + std::to_string(cache_bytes));
    params.q = q.get();
    params.out = out.get();
    params.k_cache = k.get();
    params.v_cache = v.get();
    params.query_start = query_start.get();
    params.context_lens = context_lens.get();
    params.block_tables = block_tables.get();
    set_paged_shape(params, pr);
    params.num_tokens = l.T;
    params.max_query_len = l.max_q;
    params.max_context_len = bound ? bound : l.max_ctx;
    params.cache_dtype = pr.cache_dtype;
    params.workspace = workspace.get();
    params.workspace_bytes = workspace.size();
  }

  // out and the workspace to 0xFF bytes (NaN): what a launch leaves unwritten cannot pass.
  void poison() {
    out.poison();
    workspace.poison();
  }

  DeviceBuffer<bf16> q, out;                                      // [T, hq, D]
  DeviceBuffer<uint8_t> k, v;                                     // cache bytes
  DeviceBuffer<int32_t> query_start, context_lens, block_tables;  // [S + 1], [S], [S, max_blocks]
  DeviceBuffer<unsigned char> workspace;
  kernels::cuda::PagedAttentionParams params{};
};

// The decode CTAs that a decode problem of head dim d can run on (the wide one needs d ≥ 64).
inline std::vector<kernels::cuda::DecodeCta> decode_ctas(int d) {
  using kernels::cuda::DecodeCta;
  if (d < 64) return {DecodeCta::kNarrow};
  return {DecodeCta::kNarrow, DecodeCta::kWide};
}

// Case c on inputs from `seed` (make_paged_problem): one launch on the null stream with out and
// workspace poisoned, or for a decode case one per decode CTA (decode_ctas); returns the worst
// rel L2 error of the GPU output against the CPU twin (+inf if any output is NaN/inf).
inline double run_paged_case(const PagedCase& c, uint32_t seed) {
  const PagedProblem pr = make_paged_problem(c, seed);
  const std::vector<float> want = paged_reference(pr);
  PagedDeviceProblem dev(pr, c.max_context_bound);
  const bool decode = pr.layout.max_q == 1;
  double worst = 0.0;
  for (kernels::cuda::DecodeCta cta :
       decode ? decode_ctas(c.d) : std::vector{kernels::cuda::DecodeCta::kAuto}) {
    dev.params.decode_cta = cta;
    dev.poison();
    kernels::cuda::paged_attention(dev.params, nullptr);
    worst = std::max(worst, rel_l2(dev.out.download(), want));
  }
  return worst;
}

// Benchmark inputs on `layout` (make_dense_paged_layout): the caches k and v as given (bytes of
// dtype, see PagedProblem), q random bf16 in [-1, 1) from seed 1, softmax scale 1/sqrt(d),
// v_scale 1.
inline PagedProblem make_bench_problem(PagedLayout layout, int hq, int hkv, int d, DType dtype,
                                       std::vector<uint8_t> k, std::vector<uint8_t> v) {
  PagedProblem pr;
  pr.q = random_bf16(size_t(layout.T) * hq * d, 1);
  pr.layout = std::move(layout);
  pr.num_q_heads = hq;
  pr.num_kv_heads = hkv;
  pr.head_dim = d;
  pr.cache_dtype = dtype;
  pr.k = std::move(k);
  pr.v = std::move(v);
  pr.scale = 1.0f / std::sqrt(float(d));
  return pr;
}

// Causal attention FLOPs of num_seqs sequences of q_len query rows at context ctx_len each: QKᵀ
// and PV, 2 FLOPs per multiply-add each, over the keys every query row sees.
inline double causal_attention_flops(int num_seqs, int q_len, int ctx_len, int hq, int d) {
  double keys = 0;  // Σ over query rows of visible keys
  for (int i = 0; i < q_len; ++i) keys += ctx_len - q_len + i + 1;
  return 4.0 * num_seqs * hq * d * keys;
}

}  // namespace serval::testing
