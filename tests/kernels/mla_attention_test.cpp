// CUDA MLA kernels against their CPU twins: mla_prepare + mla_attention (kernels::cpu::mla_prepare
// and mla_attention) on paged batches that mix decode, prefill with a prefix and padding tokens,
// bf16 and fp8 caches; head_linear against a host loop; add; and the CUDA backend's
// mla_attention → head_linear → add against the CPU backend's.
#include "kernels/cuda/attention/mla_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "base/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemm/head_linear.h"
#include "kernels/cuda/misc/elementwise.h"
#include "kernels/cuda_test_util.h"
#include "kernels/fp8_test_util.h"
#include "kernels/gpu_test_support.h"
#include "kernels/paged_layout_util.h"

namespace serval::testing {
namespace {

// Tolerances, rel L2 against the CPU twin's fp32 answer on the same bf16 inputs and cache bytes.
// Attention: bf16 output rounding (≈ 2e-3) plus the GPU's bf16 q_pe (the CPU keeps fp32); the same
// for bf16 and fp8 caches, as both sides read the same stored rows.
constexpr double kAttentionTol = 1e-2;
// head_linear and add: bf16 output rounding only (≈ 2e-3).
constexpr double kLinearTol = 1e-2;
constexpr double kAddTol = 1e-2;
// Cache rows written by the GPU: each element within one rounding step of the CPU's, and at least
// this fraction bit-identical (the two differ only in fp32 summation order and sincos ulps).
constexpr double kCacheExactFraction = 0.99;

struct MlaCase {
  std::string name;
  int L, R, H, nope;  // latent, rope, heads, the q projection's no-rope part (q_stride = nope + R)
  DType dtype = DType::kBF16;
  float k_scale = 1.0f;
  bool interleaved = false;
  float rope_scale = 1.0f;
  // Per sequence; a padding sequence (q 1, ctx 1) writes no row (slot −1) and reads key 0 of
  // sequence 0, as the engine's graph padding does.
  std::vector<int> q_lens, ctx_lens;
  std::vector<bool> padding;
  int block_size = 16;
  int bound = 0;  // host max_context_len; 0: the largest context
};

// Stores v / k_scale as cache element i of type t.
void cache_store(DType t, std::vector<uint8_t>& bytes, size_t i, float v) {
  if (is_fp8(t)) {
    bytes[i] = fp8_encode(t, v);
  } else {
    const bf16 b = float_to_bf16(v);
    std::memcpy(&bytes[2 * i], &b, 2);
  }
}

// One checked problem: the host inputs, the CPU twin's answer and cache, and the GPU's.
struct MlaRun {
  double out_err = INFINITY;  // rel L2 of the GPU output
  size_t cache_mismatch = 0;  // written elements more than one step from the CPU's
  double cache_exact = 0.0;   // fraction of written elements bit-identical to the CPU's
  size_t stray_writes = 0;    // bytes changed outside the written rows
  int splits = 0;
};

MlaRun run_mla_case(const MlaCase& c, uint32_t seed, bool graph = false) {
  const int L = c.L, R = c.R, H = c.H, row = L + R, q_stride = c.nope + R;
  const int S = int(c.q_lens.size());
  PagedLayout l = make_paged_layout(c.q_lens, c.ctx_lens, c.block_size, seed);
  for (int s = 0; s < S; ++s)
    if (c.padding[s]) l.tables[size_t(s) * l.max_blocks] = l.tables[0];
  const int T = l.T, bound = c.bound ? c.bound : l.max_ctx;
  const size_t slots = size_t(l.num_blocks) * l.block_size;
  const int eb = cache_elem_bytes(c.dtype);

  // Positions and slots; prefix rows get random stored values, every other byte is 0xFF (NaN in
  // bf16 and fp8): a row the GPU should write and does not, or a read of a foreign slot, shows.
  std::vector<int32_t> positions(T), slot_mapping(T);
  std::vector<bool> written(slots, false);
  std::vector<uint8_t> cache(slots * row * eb, 0xFF);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f);
  for (int s = 0; s < S; ++s) {
    const int q_len = c.q_lens[s], prefix = c.ctx_lens[s] - q_len;
    for (int j = 0; j < prefix; ++j) {
      const size_t slot = slot_of(l, size_t(s), j);
      for (int i = 0; i < row; ++i)
        cache_store(c.dtype, cache, slot * row + i, val(rng) / c.k_scale);
    }
    for (int i = 0; i < q_len; ++i) {
      const int t = l.query_start[s] + i, pos = prefix + i;
      positions[t] = pos;
      slot_mapping[t] = c.padding[s] ? -1 : int32_t(slot_of(l, size_t(s), pos));
      if (!c.padding[s]) written[size_t(slot_mapping[t])] = true;
    }
  }
  const auto q = random_bf16(size_t(T) * H * q_stride, seed + 2, -2.0f, 2.0f);
  const auto kv = random_bf16(size_t(T) * row, seed + 3, -2.0f, 2.0f);
  const auto kv_norm = random_bf16(size_t(L), seed + 4, 0.5f, 1.5f);
  const auto q_lat = random_bf16(size_t(T) * H * L, seed + 5, -1.0f, 1.0f);
  std::vector<float> inv_freq(size_t(R / 2));
  for (int i = 0; i < R / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / R);
  const float scale = 1.0f / std::sqrt(float(c.nope + R));

  // CPU twin.
  std::vector<uint8_t> cpu_cache = cache;
  const std::vector<float> q_f = to_float(q), kv_f = to_float(kv), q_lat_f = to_float(q_lat);
  std::vector<float> q_pe_f(size_t(T) * H * R), want(size_t(T) * H * L);
  kernels::MlaPrepareParams cp{};
  cp.kv = kv_f.data();
  cp.kv_norm = kv_norm.data();
  cp.kv_norm_dtype = DType::kBF16;
  cp.q = q_f.data();
  cp.q_pe = q_pe_f.data();
  cp.positions = positions.data();
  cp.slot_mapping = slot_mapping.data();
  cp.inv_freq = inv_freq.data();
  cp.cache = cpu_cache.data();
  cp.cache_dtype = c.dtype;
  cp.k_scale = c.k_scale;
  cp.num_tokens = T;
  cp.num_heads = H;
  cp.latent_dim = L;
  cp.rope_dim = R;
  cp.q_stride = q_stride;
  cp.q_rope_offset = c.nope;
  cp.eps = 1e-6f;
  cp.rope_scale = c.rope_scale;
  cp.rope_interleaved = c.interleaved;
  kernels::cpu::mla_prepare(cp);
  kernels::MlaAttentionParams ca{};
  ca.q_lat = q_lat_f.data();
  ca.q_pe = q_pe_f.data();
  ca.cache = cpu_cache.data();
  ca.cache_dtype = c.dtype;
  ca.out = want.data();
  ca.query_start = l.query_start.data();
  ca.context_lens = l.ctx_lens.data();
  ca.block_tables = l.tables.data();
  ca.num_seqs = S;
  ca.max_blocks_per_seq = l.max_blocks;
  ca.block_size = l.block_size;
  ca.num_heads = H;
  ca.latent_dim = L;
  ca.rope_dim = R;
  ca.scale = scale * c.k_scale;
  ca.v_scale = c.k_scale;
  kernels::cpu::mla_attention(ca);

  // GPU.
  DeviceBuffer<bf16> d_q(q), d_kv(kv), d_kv_norm(kv_norm), d_q_lat(q_lat);
  DeviceBuffer<bf16> d_q_pe(size_t(T) * H * R), d_out(size_t(T) * H * L);
  DeviceBuffer<float> d_inv_freq(inv_freq);
  DeviceBuffer<int32_t> d_pos(positions), d_slots(slot_mapping), d_qs(l.query_start),
      d_ctx(l.ctx_lens), d_tables(l.tables);
  DeviceBuffer<uint8_t> d_cache(cache);
  const size_t ws = kernels::cuda::mla_attention_workspace_bytes(T, H, L, bound);
  DeviceBuffer<uint8_t> d_ws(std::max<size_t>(ws, 16));
  d_q_pe.poison();
  d_out.poison();
  d_ws.poison();
  kernels::cuda::MlaPrepareParams gp{};
  gp.q = d_q.get();
  gp.kv = d_kv.get();
  gp.kv_norm = d_kv_norm.get();
  gp.positions = d_pos.get();
  gp.slot_mapping = d_slots.get();
  gp.inv_freq = d_inv_freq.get();
  gp.q_pe = d_q_pe.get();
  gp.cache = d_cache.get();
  gp.cache_dtype = c.dtype;
  gp.k_scale = c.k_scale;
  gp.num_tokens = T;
  gp.num_heads = H;
  gp.latent_dim = L;
  gp.rope_dim = R;
  gp.q_stride = q_stride;
  gp.q_rope_offset = c.nope;
  gp.eps = 1e-6f;
  gp.rope_scale = c.rope_scale;
  gp.rope_interleaved = c.interleaved;
  kernels::cuda::MlaAttentionParams ga{};
  ga.q_lat = d_q_lat.get();
  ga.q_pe = d_q_pe.get();
  ga.cache = d_cache.get();
  ga.cache_dtype = c.dtype;
  ga.out = d_out.get();
  ga.query_start = d_qs.get();
  ga.context_lens = d_ctx.get();
  ga.block_tables = d_tables.get();
  ga.num_tokens = T;
  ga.num_seqs = S;
  ga.max_blocks_per_seq = l.max_blocks;
  ga.block_size = l.block_size;
  ga.num_heads = H;
  ga.latent_dim = L;
  ga.rope_dim = R;
  ga.max_context_len = bound;
  ga.scale = scale * c.k_scale;
  ga.v_scale = c.k_scale;
  ga.workspace = d_ws.get();
  ga.workspace_bytes = ws;
  auto enqueue = [&](cudaStream_t stream) {
    kernels::cuda::mla_prepare(gp, stream);
    kernels::cuda::mla_attention(ga, stream);
  };
  if (graph) {
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    {
      CapturedGraph g(stream, enqueue);
      g.launch(stream);
      g.launch(stream);  // a replay rewrites the same rows and output
      cuda_check(cudaStreamSynchronize(stream), "graph replay");
    }
    cuda_check(cudaStreamDestroy(stream), "stream destroy");
  } else {
    enqueue(nullptr);
  }
  cuda_check(cudaGetLastError(), "mla kernels");

  MlaRun r;
  r.splits = kernels::cuda::mla_attention_num_splits(T, H, bound);
  r.out_err = rel_l2(d_out.download(), want);
  const std::vector<uint8_t> got_cache = d_cache.download();
  size_t exact = 0, total = 0;
  for (size_t slot = 0; slot < slots; ++slot) {
    const size_t b0 = slot * row * eb, b1 = b0 + size_t(row) * eb;
    if (!written[slot]) {
      for (size_t b = b0; b < b1; ++b) r.stray_writes += got_cache[b] != cache[b];
      continue;
    }
    for (int i = 0; i < row; ++i) {
      const size_t e = slot * row + i;
      const float g = cache_decode(c.dtype, got_cache, e), w = cache_decode(c.dtype, cpu_cache, e);
      ++total;
      if (g == w) {
        ++exact;
      } else if (!(std::fabs(g - w) <= cache_step(c.dtype, std::max(std::fabs(g), std::fabs(w))))) {
        ++r.cache_mismatch;
      }
    }
  }
  r.cache_exact = total ? double(exact) / double(total) : 1.0;
  return r;
}

void expect_case(const MlaCase& c, uint32_t seed, bool graph = false) {
  SCOPED_TRACE(::testing::Message() << c.name << " dtype " << dtype_name(c.dtype) << " k_scale "
                                    << c.k_scale << " interleaved " << c.interleaved << " bound "
                                    << c.bound << (graph ? " (graph)" : ""));
  const MlaRun r = run_mla_case(c, seed, graph);
  EXPECT_LT(r.out_err, kAttentionTol) << "splits " << r.splits;
  EXPECT_EQ(r.cache_mismatch, 0u);
  EXPECT_GE(r.cache_exact, kCacheExactFraction);
  EXPECT_EQ(r.stray_writes, 0u);
  std::printf(
      "[ mla ] %-32s %-8s interleaved %d bound %5d splits %2d: rel L2 %.2e, cache exact "
      "%.4f\n",
      c.name.c_str(), std::string(dtype_name(c.dtype)).c_str(), int(c.interleaved), c.bound,
      r.splits, r.out_err, r.cache_exact);
}

// The cache formats of the tests: bf16, and fp8 with a k_scale ≠ 1 (values up to ~4.5 stored
// / k_scale, inside both fp8 ranges).
struct CacheFormat {
  DType dtype;
  float k_scale;
};
const CacheFormat kFormats[] = {
    {DType::kBF16, 1.0f}, {DType::kF8E4M3, 0.5f}, {DType::kF8E5M2, 2.0f}};

// A 1-token decode at context 300, a 40-token prefill after a 50-token prefix, a padding token
// and a 3-token chunk after 17 prefix tokens.
MlaCase mixed_batch(std::string name, int L, int R, int H, int nope) {
  MlaCase c;
  c.name = std::move(name);
  c.L = L;
  c.R = R;
  c.H = H;
  c.nope = nope;
  c.rope_scale = 1.3f;
  c.q_lens = {1, 40, 1, 3};
  c.ctx_lens = {300, 90, 1, 20};
  c.padding = {false, false, true, false};
  return c;
}

TEST(CudaMlaAttention, TinyShapesMatchCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 100;
  for (const CacheFormat& f : kFormats) {
    for (bool interleaved : {false, true}) {
      for (int H : {4, 6}) {  // 6: a warp with two heads past num_heads
        for (int bound : {0, 8192}) {
          MlaCase c = mixed_batch("tiny L32 R8 H" + std::to_string(H), 32, 8, H, 16);
          c.dtype = f.dtype;
          c.k_scale = f.k_scale;
          c.interleaved = interleaved;
          c.bound = bound;
          expect_case(c, seed++);
        }
      }
      // Contexts ≤ 256: one split.
      MlaCase c = mixed_batch("tiny short", 32, 8, 4, 16);
      c.ctx_lens = {200, 90, 1, 20};
      c.dtype = f.dtype;
      c.k_scale = f.k_scale;
      c.interleaved = interleaved;
      expect_case(c, seed++);
    }
  }
}

TEST(CudaMlaAttention, DeepSeekShapesMatchCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 200;
  for (const CacheFormat& f : kFormats) {
    if (f.dtype == DType::kF8E5M2) continue;  // e4m3 is the fp8 cache of DeepSeek checkpoints
    for (bool interleaved : {false, true}) {
      for (int bound : {0, 8192}) {
        MlaCase c = mixed_batch("deepseek L512 R64 H16", 512, 64, 16, 128);
        c.dtype = f.dtype;
        c.k_scale = f.k_scale;
        c.interleaved = interleaved;
        c.bound = bound;
        expect_case(c, seed++);
      }
    }
  }
  // 20 heads: a second head group of one warp; block size 32.
  MlaCase c = mixed_batch("deepseek H20 bs32", 512, 64, 20, 128);
  c.block_size = 32;
  c.interleaved = true;
  expect_case(c, seed++);
  // Other latent widths (one, two and four latent pairs per lane).
  for (int L : {64, 128, 256}) {
    MlaCase w = mixed_batch("latent " + std::to_string(L), L, 64, 16, 32);
    w.dtype = DType::kF8E4M3;
    w.k_scale = 0.5f;
    expect_case(w, seed++);
  }
}

// 301 tokens fill the grid: one split, every token its own CTA over up to 500 keys.
TEST(CudaMlaAttention, LongPrefillMatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  uint32_t seed = 300;
  for (const CacheFormat& f : kFormats) {
    if (f.dtype == DType::kF8E5M2) continue;
    MlaCase c;
    c.name = "prefill 300 + decode 500";
    c.L = 512;
    c.R = 64;
    c.H = 16;
    c.nope = 128;
    c.dtype = f.dtype;
    c.k_scale = f.k_scale;
    c.rope_scale = 1.3f;
    c.q_lens = {300, 1};
    c.ctx_lens = {300, 500};
    c.padding = {false, false};
    expect_case(c, seed++);
  }
}

// Captured in a CUDA graph on a non-blocking stream and replayed twice: the same answer.
TEST(CudaMlaAttention, GraphReplayMatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (int bound : {0, 8192}) {
    MlaCase c = mixed_batch("deepseek graph", 512, 64, 16, 128);
    c.dtype = DType::kF8E4M3;
    c.k_scale = 0.5f;
    c.bound = bound;
    expect_case(c, 400 + bound % 7, /*graph=*/true);
  }
}

TEST(CudaMlaAttention, RefusesUnsupportedShapes) {
  kernels::cuda::MlaAttentionParams p{};
  p.num_heads = 4;
  p.block_size = 16;
  p.num_seqs = 1;
  p.num_tokens = 1;
  p.latent_dim = 1024;  // above 512
  p.rope_dim = 64;
  EXPECT_THROW(kernels::cuda::mla_attention(p, nullptr), InvalidArgument);
  p.latent_dim = 512;
  p.rope_dim = 128;  // above 64
  EXPECT_THROW(kernels::cuda::mla_attention(p, nullptr), InvalidArgument);
  kernels::cuda::MlaPrepareParams q{};
  q.num_heads = 4;
  q.latent_dim = 32;
  q.rope_dim = 8;
  q.q_stride = 16;
  q.q_rope_offset = 12;  // 12 + 8 > 16
  EXPECT_THROW(kernels::cuda::mla_prepare(q, nullptr), InvalidArgument);
}

// Timings, not a check (--gtest_also_run_disabled_tests): decode batches of DeepSeek-V3 shapes
// (128 heads per rank, and 16 as under TP 8) at context 4096 and a prefill chunk, cache bytes
// constant (the time does not depend on the values).
TEST(CudaMlaAttention, DISABLED_Bench) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  const int L = 512, R = 64, bs = 16;
  struct Shape {
    int H, seqs, q_len, ctx;
  };
  for (DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    for (const Shape& s : {Shape{128, 1, 1, 4096}, Shape{128, 32, 1, 4096},
                           Shape{128, 128, 1, 4096}, Shape{16, 1, 1, 4096}, Shape{16, 64, 1, 4096},
                           Shape{16, 1, 1, 32768}, Shape{16, 1, 512, 4096}}) {
      const PagedLayout l = make_dense_paged_layout(s.seqs, s.q_len, s.ctx, bs);
      const int T = l.T;
      const size_t row_bytes = size_t(L + R) * cache_elem_bytes(dtype);
      DeviceBuffer<uint8_t> d_cache(size_t(l.num_blocks) * bs * row_bytes);
      cuda_check(cudaMemset(d_cache.get(), 0x3C, d_cache.size()), "memset");
      DeviceBuffer<bf16> d_q_lat(random_bf16(size_t(T) * s.H * L, 1)),
          d_q_pe(random_bf16(size_t(T) * s.H * R, 2)), d_out(size_t(T) * s.H * L);
      DeviceBuffer<int32_t> d_qs(l.query_start), d_ctx(l.ctx_lens), d_tables(l.tables);
      const size_t ws = kernels::cuda::mla_attention_workspace_bytes(T, s.H, L, s.ctx);
      DeviceBuffer<uint8_t> d_ws(std::max<size_t>(ws, 16));
      kernels::cuda::MlaAttentionParams p{};
      p.q_lat = d_q_lat.get();
      p.q_pe = d_q_pe.get();
      p.cache = d_cache.get();
      p.cache_dtype = dtype;
      p.out = d_out.get();
      p.query_start = d_qs.get();
      p.context_lens = d_ctx.get();
      p.block_tables = d_tables.get();
      p.num_tokens = T;
      p.num_seqs = s.seqs;
      p.max_blocks_per_seq = l.max_blocks;
      p.block_size = bs;
      p.num_heads = s.H;
      p.latent_dim = L;
      p.rope_dim = R;
      p.max_context_len = s.ctx;
      p.scale = 0.07f;
      p.workspace = d_ws.get();
      p.workspace_bytes = ws;
      constexpr int kIters = 10;
      cudaEvent_t start, stop;
      cuda_check(cudaEventCreate(&start), "event");
      cuda_check(cudaEventCreate(&stop), "event");
      kernels::cuda::mla_attention(p, nullptr);
      cuda_check(cudaEventRecord(start), "record");
      for (int i = 0; i < kIters; ++i) kernels::cuda::mla_attention(p, nullptr);
      cuda_check(cudaEventRecord(stop), "record");
      cuda_check(cudaEventSynchronize(stop), "sync");
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      const double us = 1e3 * ms / kIters;
      const double cache_gb = double(s.seqs) * s.ctx * row_bytes / 1e9;
      std::printf(
          "[ mla bench ] %-6s H %3d seqs %3d q_len %3d ctx %5d splits %2d: %9.1f us, cache "
          "%.0f GB/s\n",
          std::string(dtype_name(dtype)).c_str(), s.H, s.seqs, s.q_len, s.ctx,
          kernels::cuda::mla_attention_num_splits(T, s.H, s.ctx), us, cache_gb / us * 1e6);
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
  }
}

TEST(CudaHeadLinear, DISABLED_Bench) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  struct Shape {
    int H, n, k, x_stride;
  };
  for (const Shape& s : {Shape{128, 512, 128, 192}, Shape{128, 128, 512, 512}}) {
    for (int T : {1, 8, 64, 4096}) {
      DeviceBuffer<bf16> d_x(random_bf16(size_t(T) * s.H * s.x_stride, 1)),
          d_w(random_bf16(size_t(s.H) * s.n * s.k, 2)), d_y(size_t(T) * s.H * s.n);
      const kernels::cuda::HeadLinearParams p{d_x.get(), d_w.get(), d_y.get(), T,
                                              s.H,       s.n,       s.k,       s.x_stride};
      constexpr int kIters = 10;
      cudaEvent_t start, stop;
      cuda_check(cudaEventCreate(&start), "event");
      cuda_check(cudaEventCreate(&stop), "event");
      kernels::cuda::head_linear(p, nullptr);
      cuda_check(cudaEventRecord(start), "record");
      for (int i = 0; i < kIters; ++i) kernels::cuda::head_linear(p, nullptr);
      cuda_check(cudaEventRecord(stop), "record");
      cuda_check(cudaEventSynchronize(stop), "sync");
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      const double us = 1e3 * ms / kIters;
      std::printf(
          "[ head_linear bench ] T %4d H %d n %3d k %3d: %8.1f us, weights %.0f GB/s, %.1f "
          "TFLOP/s\n",
          T, s.H, s.n, s.k, us, 2.0 * s.H * s.n * s.k / us / 1e3,
          2.0 * T * s.H * s.n * s.k / us / 1e6);
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
  }
}

// y[t, h·n + i] = Σ_j w[h, i, j] · x[t, h·x_stride + j] in double.
std::vector<float> head_linear_reference(const std::vector<float>& x, const std::vector<float>& w,
                                         int T, int H, int n, int k, int x_stride) {
  std::vector<float> y(size_t(T) * H * n);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < n; ++i) {
        double sum = 0;
        const float* xr = &x[(size_t(t) * H + h) * x_stride];
        const float* wr = &w[(size_t(h) * n + i) * k];
        for (int j = 0; j < k; ++j) sum += double(wr[j]) * xr[j];
        y[(size_t(t) * H + h) * n + i] = float(sum);
      }
  return y;
}

// Both MLA orientations (q → latent: n 512, k 128 of a 192-wide q head; latent → values: n 128,
// k 512) at decode and prefill token counts, and odd shapes: k % 8 ≠ 0 (tiled path at any T) and
// 5 chunks per row (streaming with a partial lane group).
TEST(CudaHeadLinear, MatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  struct Shape {
    int H, n, k, x_stride;
  };
  uint32_t seed = 500;
  for (const Shape& s : {Shape{16, 512, 128, 192}, Shape{16, 128, 512, 512}, Shape{3, 20, 12, 13},
                         Shape{5, 24, 40, 40}}) {
    for (int T : {1, 3, 64, 300}) {
      SCOPED_TRACE(::testing::Message() << "T " << T << " H " << s.H << " n " << s.n << " k " << s.k
                                        << " x_stride " << s.x_stride);
      const auto x = random_bf16(size_t(T) * s.H * s.x_stride, seed++, -2.0f, 2.0f);
      const auto w = random_bf16(size_t(s.H) * s.n * s.k, seed++, -0.5f, 0.5f);
      const auto want =
          head_linear_reference(to_float(x), to_float(w), T, s.H, s.n, s.k, s.x_stride);
      DeviceBuffer<bf16> d_x(x), d_w(w), d_y(want.size());
      d_y.poison();
      kernels::cuda::head_linear({d_x.get(), d_w.get(), d_y.get(), T, s.H, s.n, s.k, s.x_stride},
                                 nullptr);
      cuda_check(cudaGetLastError(), "head_linear");
      EXPECT_LT(rel_l2(d_y.download(), want), kLinearTol);
    }
  }
}

// out += x: the 16-byte path (n 4096) and the scalar one (n 1001, and 4096 off alignment).
TEST(CudaAdd, MatchesCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  for (const auto& [n, offset] :
       std::vector<std::pair<int, int>>{{4096, 0}, {1001, 0}, {4096, 1}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
    const auto x = random_bf16(size_t(n + offset), uint32_t(n + 7), -2.0f, 2.0f);
    const auto out = random_bf16(size_t(n), uint32_t(n + 8), -2.0f, 2.0f);
    std::vector<float> want = to_float(out);
    for (int i = 0; i < n; ++i) want[i] += bf16_to_float(x[size_t(i + offset)]);
    DeviceBuffer<bf16> d_x(x), d_out(out);
    kernels::cuda::add({d_x.get() + offset, d_out.get(), n}, nullptr);
    cuda_check(cudaGetLastError(), "add");
    EXPECT_LT(rel_l2(d_out.download(), want), kAddTol);
  }
}

// The backends' MLA core of one layer on the same inputs: mla_attention (bf16 cache, mixed batch),
// then head_linear to 128-wide values and add onto a residual.
TEST(CudaBackendMla, MatchesCpuBackend) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA GPU: skipped";
  auto cpu = backend::make_cpu_backend();
  auto gpu = backend::make_cuda_backend();
  ASSERT_TRUE(cpu && gpu);
  const int L = 512, R = 64, H = 16, nope = 128, V = 128, q_stride = nope + R, bs = 16;
  const std::vector<int> q_lens{1, 40, 3}, ctx_lens{300, 90, 20};
  const PagedLayout l = make_paged_layout(q_lens, ctx_lens, bs, 77);
  const int T = l.T, S = int(q_lens.size());
  std::vector<int32_t> positions(T), slot_mapping(T);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < q_lens[s]; ++i) {
      const int t = l.query_start[s] + i, pos = ctx_lens[s] - q_lens[s] + i;
      positions[t] = pos;
      slot_mapping[t] = int32_t(slot_of(l, size_t(s), pos));
    }
  const auto cache = random_bf16(size_t(l.num_blocks) * bs * (L + R), 78, -2.0f, 2.0f);
  const auto q = random_bf16(size_t(T) * H * q_stride, 79, -2.0f, 2.0f);
  const auto q_lat = random_bf16(size_t(T) * H * L, 80, -1.0f, 1.0f);
  const auto kv = random_bf16(size_t(T) * (L + R), 81, -2.0f, 2.0f);
  const auto kv_norm = random_bf16(size_t(L), 82, 0.5f, 1.5f);
  const auto w_value = random_bf16(size_t(H) * V * L, 83, -0.1f, 0.1f);
  const auto residual = random_bf16(size_t(T) * H * V, 84, -1.0f, 1.0f);
  std::vector<float> inv_freq(size_t(R / 2));
  for (int i = 0; i < R / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / R);
  const std::vector<float> q_f = to_float(q), q_lat_f = to_float(q_lat), kv_f = to_float(kv),
                           residual_f = to_float(residual);

  // Activations: f32 on the CPU, bf16 on the GPU; weights, metadata and the bf16 cache alike.
  // Each backend gets its own copy (the CPU backend's upload keeps the host tensor).
  auto copy = [](backend::Backend& b, const void* data, DType dtype, Shape shape) {
    Tensor h = host_empty(dtype, std::move(shape));
    std::memcpy(h.data, data, h.nbytes());
    return b.upload(h);
  };
  auto activation = [&](backend::Backend& b, const std::vector<float>& f,
                        const std::vector<bf16>& h, Shape shape) {
    return b.device() == Device::kCpu ? copy(b, f.data(), DType::kF32, std::move(shape))
                                      : copy(b, h.data(), DType::kBF16, std::move(shape));
  };
  auto ints = [&](backend::Backend& b, const std::vector<int32_t>& v, Shape shape) {
    return copy(b, v.data(), DType::kI32, std::move(shape));
  };
  struct Side {
    Tensor q, q_lat, kv, kv_norm, inv_freq, w_value, residual, out, values;
    backend::KvCacheLayer cache;
    backend::StepMetadata meta;
  };
  auto make_side = [&](backend::Backend& b) {
    Side s;
    s.q = activation(b, q_f, q, {T, H * q_stride});
    s.q_lat = activation(b, q_lat_f, q_lat, {T, H * L});
    s.kv = activation(b, kv_f, kv, {T, L + R});
    s.residual = activation(b, residual_f, residual, {T, H * V});
    s.kv_norm = copy(b, kv_norm.data(), DType::kBF16, {L});
    s.inv_freq = copy(b, inv_freq.data(), DType::kF32, {R / 2});
    s.w_value = b.upload_weight(host_view(w_value.data(), DType::kBF16, {H, V, L}, nullptr));
    s.cache.k = copy(b, cache.data(), DType::kBF16, {l.num_blocks, bs, 1, L + R});
    s.cache.block_size = bs;
    s.meta.positions = ints(b, positions, {T});
    s.meta.slot_mapping = ints(b, slot_mapping, {T});
    s.meta.query_start = ints(b, l.query_start, {S + 1});
    s.meta.context_lens = ints(b, l.ctx_lens, {S});
    s.meta.block_tables = ints(b, l.tables, {S, l.max_blocks});
    s.meta.num_tokens = T;
    s.meta.num_seqs = S;
    s.meta.max_blocks_per_seq = l.max_blocks;
    s.meta.max_query_len = l.max_q;
    s.meta.max_context_len = l.max_ctx;
    const DType act = b.activation_dtype();
    s.out = b.empty(act, {T, H * L});
    s.values = b.empty(act, {T, H * V});
    backend::MlaParams p;
    p.num_heads = H;
    p.latent_dim = L;
    p.rope_dim = R;
    p.q_stride = q_stride;
    p.q_rope_offset = nope;
    p.scale = 1.0f / std::sqrt(float(q_stride));
    p.rope_scale = 1.3f;
    p.rope_interleaved = true;
    p.kv_norm = &s.kv_norm;
    p.inv_freq = &s.inv_freq;
    b.mla_attention(s.q, s.q_lat, s.kv, p, s.cache, s.meta, s.out);
    b.head_linear(s.out, L, s.w_value, s.values);
    b.add(s.values, s.residual);
    b.synchronize();
    return s;
  };
  Side c = make_side(*cpu), g = make_side(*gpu);
  auto as_float = [&](backend::Backend& b, const Tensor& t) {
    std::vector<float> f(size_t(t.numel()));
    if (t.dtype == DType::kF32) {
      b.download(t, f.data());
    } else {
      std::vector<bf16> h(size_t(t.numel()));
      b.download(t, h.data());
      f = to_float(h);
    }
    return f;
  };
  EXPECT_LT(rel_l2(as_float(*gpu, g.out), as_float(*cpu, c.out)), kAttentionTol);
  EXPECT_LT(rel_l2(as_float(*gpu, g.residual), as_float(*cpu, c.residual)), kAttentionTol);
  EXPECT_LT(rel_l2(as_float(*gpu, g.cache.k), as_float(*cpu, c.cache.k)), 1e-2);
}

}  // namespace
}  // namespace serval::testing
