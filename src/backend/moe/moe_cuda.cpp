// Host orchestration of the CUDA MoE backends (compiled only with CUDA).
#ifdef SERVAL_HAVE_CUDA
#include "backend/moe/moe_cuda.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/moe/moe_fp8_scales.h"
#include "base/error.h"
#include "kernels/cuda/misc/timeline_probe.h"
#include "kernels/cuda/moe/moe_fp8_repack.h"
#include "kernels/cuda/moe/moe_gemm.h"
#include "kernels/cuda/moe/moe_gemv_nvfp4.h"
#include "kernels/cuda/moe/moe_nvfp4_repack.h"
#include "kernels/cuda/moe/moe_routing.h"
#include "kernels/cuda/quant/nvfp4_expert_rows.h"
#include "kernels/moe_fp8_layout.h"

namespace serval::backend::moe {

namespace kc = serval::kernels::cuda;

namespace {

constexpr int kThroughputTile = 128;

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

// Byte offsets of the workspace pieces for `tokens` tokens and token tile `tile`.
struct Layout {
  size_t topk_ids, topk_weights, e2p, p2t, gemm1_rows, tile_expert, num_tiles, chunk_counts, act, y,
      total;
  int max_tiles, max_rows;
};

Layout layout(int tokens, int top_k, int num_local, int hidden, int inter, int tile) {
  Layout l{};
  const size_t pairs = size_t(tokens) * top_k;
  l.max_tiles = kc::moe_max_tiles(int(pairs), num_local, tile);
  l.max_rows = l.max_tiles * tile;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    size_t at = off;
    off += align256(bytes);
    return at;
  };
  l.topk_ids = take(pairs * 4);
  l.topk_weights = take(pairs * 4);
  l.e2p = take(pairs * 4);
  l.p2t = take(size_t(l.max_rows) * 4);
  l.gemm1_rows = take(size_t(l.max_rows) * 4);
  l.tile_expert = take(size_t(l.max_tiles) * 4);
  l.num_tiles = take(4);
  l.chunk_counts = take(size_t(kc::kMoeMaxMapChunks) * num_local * 4);
  l.act = take(size_t(l.max_rows) * inter * 2);
  l.y = take(size_t(l.max_rows) * hidden * 2);
  l.total = off;
  return l;
}

// The end of a load-time repack: waits for `stream` (after `status`, the enqueueing's result),
// then q holds the repacked stack of rows × k.
void adopt_repacked(QuantizedWeight& q, const Tensor& data, const Tensor& scales, int rows, int k,
                    cudaError_t status, cudaStream_t stream, const std::string& what) {
  if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  if (status != cudaSuccess)
    throw Error("cuda backend: repacking " + what + " failed: " + cudaGetErrorString(status));
  q.data = data;
  q.scales = scales;
  q.n = rows;
  q.k = k;
}

int tile_for(const MoeCudaArgs& a) {
  return moe_step_kernels(a) == MoeCudaBackend::kThroughput
             ? kThroughputTile
             : moe_latency_tile(a.num_tokens, a.top_k, a.num_local);
}

}  // namespace

MoeCudaBackend parse_moe_backend(const std::string& name) {
  if (name == "latency") return MoeCudaBackend::kLatency;
  if (name == "throughput") return MoeCudaBackend::kThroughput;
  throw InvalidArgument("unknown MoE backend '" + name + "' (choices: latency, throughput)");
}

int moe_latency_tile(int num_tokens, int top_k, int num_local) {
  const long pairs = long(num_tokens) * top_k;
  const long per_expert = num_local > 0 ? (pairs + num_local - 1) / num_local : 0;
  int tile = 8;
  while (tile < per_expert && tile < 64) tile *= 2;
  return tile;
}

bool moe_large_steps_on_throughput_default() {
  static const bool on = [] {
    const char* env = std::getenv("SERVAL_MOE_LATENCY_KERNELS_ONLY");
    return env == nullptr || std::string(env) != "1";
  }();
  return on;
}

MoeCudaBackend moe_step_kernels(const MoeCudaArgs& a) {
  if (a.backend == MoeCudaBackend::kThroughput || !a.large_steps_on_throughput) return a.backend;
  // FP8 experts take bf16's limit (their throughput kernels are the mma.sync ones; not tuned).
  return moe_latency_hands_over(a.num_tokens, a.top_k, a.num_experts,
                                a.format == MoeExpertFormat::kNvfp4)
             ? MoeCudaBackend::kThroughput
             : MoeCudaBackend::kLatency;
}

bool moe_runs_gemv(const MoeCudaArgs& a) {
  return moe_step_kernels(a) == MoeCudaBackend::kLatency && a.format == MoeExpertFormat::kNvfp4 &&
         !moe_quantizes_activations(a) &&
         kc::moe_gemv_nvfp4_supported(a.num_tokens, a.top_k, a.hidden, a.inter);
}

bool moe_quantizes_activations(const MoeCudaArgs& a) {
  return a.gate_up_act_scales != nullptr || a.down_act_scales != nullptr;
}

size_t moe_workspace_bytes(int max_tokens, int top_k, int num_local, int hidden, int inter) {
  // Rows grow with the token count for a fixed tile, so the maximum over tiles at max_tokens
  // bounds every smaller call.
  size_t bytes = 0;
  for (int tile : {8, 16, 32, 64, kThroughputTile})
    bytes = std::max(bytes, layout(max_tokens, top_k, num_local, hidden, inter, tile).total);
  return bytes;
}

MoeWorkspaceView moe_workspace_view(const MoeCudaArgs& a) {
  const int tile = tile_for(a);
  const Layout l = layout(a.num_tokens, a.top_k, a.num_local, a.hidden, a.inter, tile);
  if (a.workspace == nullptr || a.workspace_bytes < l.total)
    throw InvalidArgument("moe_forward_cuda: workspace of " + std::to_string(a.workspace_bytes) +
                          " bytes, need " + std::to_string(l.total) + " for " +
                          std::to_string(a.num_tokens) + " tokens");
  char* base = static_cast<char*>(a.workspace);
  MoeWorkspaceView v{};
  v.topk_ids = reinterpret_cast<int32_t*>(base + l.topk_ids);
  v.topk_weights = reinterpret_cast<float*>(base + l.topk_weights);
  v.expanded_to_permuted = reinterpret_cast<int32_t*>(base + l.e2p);
  v.permuted_to_token = reinterpret_cast<int32_t*>(base + l.p2t);
  v.gemm1_rows = reinterpret_cast<int32_t*>(base + l.gemm1_rows);
  v.tile_expert = reinterpret_cast<int32_t*>(base + l.tile_expert);
  v.num_tiles = reinterpret_cast<int32_t*>(base + l.num_tiles);
  v.chunk_counts = reinterpret_cast<int32_t*>(base + l.chunk_counts);
  v.act = reinterpret_cast<bf16*>(base + l.act);
  v.y = reinterpret_cast<bf16*>(base + l.y);
  v.tile = tile;
  v.max_tiles = l.max_tiles;
  v.max_rows = l.max_rows;
  return v;
}

MoeGroupedGemms moe_grouped_gemm_params(const MoeCudaArgs& a, const MoeWorkspaceView& ws) {
  const auto config = moe_step_kernels(a) == MoeCudaBackend::kThroughput
                          ? kc::MoeGemmConfig::kThroughput
                          : kc::MoeGemmConfig::kLatency;
  kc::MoeGemmParams g1{};
  g1.gemm1 = true;
  g1.config = config;
  g1.input = a.x;
  const bool fp4 = a.format == MoeExpertFormat::kNvfp4, fp8 = a.format == MoeExpertFormat::kFp8;
  if (fp4) {
    for (const MoeNvfp4Stack* q : {&a.gate_up_q, &a.down_q})
      if (!q->codes || !q->scales || !q->global_scales)
        throw InvalidArgument(
            "moe_forward_cuda: NVFP4 experts need codes, scales and global scales");
    g1.format = kc::MoeWeightFormat::kNvfp4;
    g1.weights = a.gate_up_q.codes;
    g1.weight_scales = a.gate_up_q.scales;
    g1.global_scales = a.gate_up_q.global_scales;
  } else if (fp8) {
    for (const MoeFp8Stack* q : {&a.gate_up_f8, &a.down_f8})
      if (!q->codes || (q->multipliers == nullptr) == (q->row_scales == nullptr))
        throw InvalidArgument(
            "moe_forward_cuda: FP8 experts need codes and either block multipliers or row scales");
    g1.format = kc::MoeWeightFormat::kFp8;
    g1.weights = a.gate_up_f8.codes;
    g1.fp8_multipliers = a.gate_up_f8.multipliers;
    g1.row_scales = a.gate_up_f8.row_scales;
  } else {
    g1.weights = a.gate_up;
  }
  g1.output = ws.act;
  g1.permuted_to_token = ws.permuted_to_token;
  g1.tile_expert = ws.tile_expert;
  g1.num_tiles = ws.num_tiles;
  g1.max_tiles = ws.max_tiles;
  g1.tile = ws.tile;
  g1.n_out = a.inter;
  g1.k = a.hidden;
  kc::MoeGemmParams g2 = g1;
  g2.gemm1 = false;
  g2.input = ws.act;
  g2.weights = fp4   ? static_cast<const void*>(a.down_q.codes)
               : fp8 ? static_cast<const void*>(a.down_f8.codes)
                     : a.down;
  g2.weight_scales = fp4 ? a.down_q.scales : nullptr;
  g2.global_scales = fp4 ? a.down_q.global_scales : nullptr;
  g2.fp8_multipliers = fp8 ? a.down_f8.multipliers : nullptr;
  g2.row_scales = fp8 ? a.down_f8.row_scales : nullptr;
  g2.output = ws.y;
  // GEMM2 reads the map only for which rows of a tile hold tokens (moe_gemm.h).
  g2.permuted_to_token = ws.permuted_to_token;
  g2.n_out = a.hidden;
  g2.k = a.inter;
  return {g1, g2};
}

kc::MoeGemvNvfp4Params moe_gemv_params(const MoeCudaArgs& a, const MoeWorkspaceView& ws) {
  return {a.x,
          a.gate_up_q.codes,
          a.gate_up_q.scales,
          a.gate_up_q.global_scales,
          a.down_q.codes,
          a.down_q.scales,
          a.down_q.global_scales,
          ws.topk_ids,
          ws.topk_weights,
          ws.act,
          a.out,
          a.num_tokens,
          a.top_k,
          a.hidden,
          a.inter,
          a.local_offset,
          a.num_local};
}

bool moe_forward_cuda(const MoeCudaArgs& a, cudaStream_t stream) {
  if (a.num_tokens <= 0) return false;
  if (a.hidden % 128 != 0 || a.inter % 64 != 0 || a.hidden <= 0 || a.inter <= 0)
    throw InvalidArgument(
        "moe_forward_cuda: hidden must be a multiple of 128 and inter of 64 "
        "(got hidden=" +
        std::to_string(a.hidden) + ", inter=" + std::to_string(a.inter) + ")");
  if (a.local_offset < 0 || a.num_local < 0 || a.local_offset + a.num_local > a.num_experts)
    throw InvalidArgument("moe_forward_cuda: local expert slice outside [0, num_experts)");
  if (moe_quantizes_activations(a) && a.format != MoeExpertFormat::kNvfp4)
    throw InvalidArgument("moe_forward_cuda: activation quantization (W4A4) needs NVFP4 experts");
  const MoeWorkspaceView ws = moe_workspace_view(a);

  kc::MoeRoutingParams rp{};
  rp.logits = a.router_logits;
  rp.correction_bias = a.correction_bias;
  rp.num_tokens = a.num_tokens;
  rp.num_experts = a.num_experts;
  rp.top_k = a.top_k;
  rp.method = a.routing;
  rp.renormalize = a.renormalize;
  rp.num_groups = a.num_groups;
  rp.topk_groups = a.topk_groups;
  rp.routed_scaling_factor = a.routed_scaling_factor;
  rp.local_offset = a.local_offset;
  rp.num_local = a.num_local;
  rp.tile = ws.tile;
  rp.topk_ids = ws.topk_ids;
  rp.topk_weights = ws.topk_weights;
  rp.expanded_to_permuted = ws.expanded_to_permuted;
  rp.permuted_to_token = ws.permuted_to_token;
  rp.tile_expert = ws.tile_expert;
  rp.num_tiles = ws.num_tiles;
  rp.chunk_counts = ws.chunk_counts;
  const bool gemv = moe_runs_gemv(a);
  if (a.route_in_gemv && (a.routed || !gemv))
    throw InvalidArgument("moe_forward_cuda: routing in the expert GEMVs needs the GEMV path");
  if (!a.routed && !a.route_in_gemv) {
    kc::moe_routing(rp, stream);
    kc::timeline_mark("moe routing", stream);
  }

  // A few tokens with NVFP4 experts: two GEMV-style kernels (gate_up + SwiGLU; down with the
  // weighted combine, so no finalize) on the repacked stacks, dequantized as the grouped GEMM
  // does. (Two bf16 counterparts, register-streaming and on bulk copies, measured no faster than
  // the grouped GEMMs in the model and were removed: bench/RESULTS.md.)
  if (gemv) {
    const kc::MoeGemvRouting routing{a.router_logits, rp};
    kc::moe_gemv_nvfp4(moe_gemv_params(a, ws), stream, a.route_in_gemv ? &routing : nullptr);
    return false;
  }

  MoeGroupedGemms g = moe_grouped_gemm_params(a, ws);
  // W4A4: the rows each GEMM reads, quantized per expert. GEMM1's go into y (written only by
  // GEMM2, after GEMM1 has completed) and are read through a map of their own.
  auto quantize_rows = [&](const bf16* src, bool gather, bf16* dst, int n, const float* scales) {
    kc::nvfp4_fake_quant_expert_rows(
        {src, gather, dst, ws.gemm1_rows, ws.permuted_to_token, ws.tile_expert, ws.num_tiles,
         scales, ws.tile, ws.max_rows, n},
        stream);
  };
  if (a.gate_up_act_scales) {
    quantize_rows(a.x, true, ws.y, a.hidden, a.gate_up_act_scales);
    g.gemm1.input = ws.y;
    g.gemm1.permuted_to_token = ws.gemm1_rows;
  }
  kc::moe_grouped_gemm(g.gemm1, stream);
  kc::timeline_mark("moe gemm1", stream);
  if (a.down_act_scales) quantize_rows(ws.act, false, ws.act, a.inter, a.down_act_scales);
  kc::moe_grouped_gemm(g.gemm2, stream);
  kc::timeline_mark("moe gemm2", stream);

  kc::moe_finalize({ws.y, ws.expanded_to_permuted, ws.topk_weights, a.out, a.num_tokens, a.top_k,
                    a.hidden, a.next_norm},
                   stream);
  return a.next_norm.residual != nullptr;
}

void prepare_nvfp4_experts(QuantizedWeight& q, bool gated, int rows, int k, Backend& backend,
                           cudaStream_t stream, const std::string& what) {
  if (q.format != kernels::WeightFormat::kNvfp4)
    throw InvalidArgument("cuda backend: " + what + " are " +
                          std::string(weight_format_name(q.format)) +
                          ", not NVFP4 (prepare_fp8_experts takes FP8 stacks)");
  const int E = q.experts;
  const size_t src_data = size_t(E) * q.n * (q.k / 2), src_scales = size_t(E) * q.n * (q.k / 16);
  if (E <= 0 || q.n <= 0 || q.k % 16 != 0 || q.data.nbytes() != src_data ||
      q.scales.nbytes() != src_scales || q.global_scale.size() != size_t(E) ||
      q.data.device != Device::kCuda || q.scales.device != Device::kCuda)
    throw InvalidArgument(
        "cuda backend: " + what + ": NVFP4 stack of " + std::to_string(E) + " experts × " +
        std::to_string(q.n) + " × " + std::to_string(q.k) + " has inconsistent sizes (data " +
        std::to_string(q.data.nbytes()) + " B, scales " + std::to_string(q.scales.nbytes()) +
        " B, " + std::to_string(q.global_scale.size()) + " global scales) or is not on the device");
  const size_t scale_bytes = kc::moe_nvfp4_scale_bytes(E, rows, k);
  Tensor data = backend.empty(DType::kU8, {int64_t(kc::moe_nvfp4_data_bytes(E, rows, k))});
  Tensor scales = backend.empty(DType::kU8, {int64_t(align256(scale_bytes) + 4 * size_t(E))});
  kc::MoeNvfp4RepackParams p{};
  p.src_data = q.data.as<const uint8_t>();
  p.src_scales = static_cast<const uint8_t*>(q.scales.data);
  p.dst_data = data.as<uint8_t>();
  p.dst_scales = scales.as<uint8_t>();
  p.experts = E;
  p.src_rows = q.n;
  p.src_k = q.k;
  p.rows = rows;
  p.k = k;
  p.gated = gated;
  kc::moe_nvfp4_repack(p, stream);
  const cudaError_t e =
      cudaMemcpyAsync(static_cast<char*>(scales.data) + align256(scale_bytes),
                      q.global_scale.data(), 4 * size_t(E), cudaMemcpyHostToDevice, stream);
  adopt_repacked(q, data, scales, rows, k, e, stream, what);
}

MoeNvfp4Stack nvfp4_stack_view(const QuantizedWeight& q) {
  const size_t scale_bytes = kc::moe_nvfp4_scale_bytes(q.experts, q.n, q.k);
  if (q.format != kernels::WeightFormat::kNvfp4 || q.scales.dtype != DType::kU8 ||
      q.scales.shape.size() != 1 ||
      q.scales.nbytes() != align256(scale_bytes) + 4 * size_t(q.experts))
    throw InvalidArgument(
        "moe_forward_cuda: NVFP4 experts were not prepared for CUDA "
        "(prepare_nvfp4_experts)");
  MoeNvfp4Stack s;
  s.codes = q.data.as<const uint8_t>();
  s.scales = static_cast<const uint8_t*>(q.scales.data);
  s.global_scales = reinterpret_cast<const float*>(s.scales + align256(scale_bytes));
  return s;
}

namespace {

// Whether q's data is an FP8 stack repacked by prepare_fp8_experts (u8, one dimension).
bool fp8_data_repacked(const QuantizedWeight& q) {
  return q.data.dtype == DType::kU8 && q.data.shape.size() == 1 &&
         q.data.nbytes() == kc::moe_fp8_data_bytes(q.experts, q.n, q.k);
}

}  // namespace

bool is_fp8_experts(const QuantizedWeight& q) {
  return q.format == kernels::WeightFormat::kFp8PerTensor ||
         q.format == kernels::WeightFormat::kFp8PerChannel ||
         q.format == kernels::WeightFormat::kFp8Block;
}

void prepare_fp8_experts(QuantizedWeight& q, bool gated, int rows, int k, Backend& backend,
                         cudaStream_t stream, const std::string& what) {
  const int E = q.experts;
  const bool block = q.format == kernels::WeightFormat::kFp8Block;
  const bool channel = q.format == kernels::WeightFormat::kFp8PerChannel;
  size_t scale_count = 0;
  if (block && q.block_n > 0 && q.block_k > 0)
    scale_count =
        size_t(E) * ((q.n + q.block_n - 1) / q.block_n) * ((q.k + q.block_k - 1) / q.block_k);
  if (channel) scale_count = size_t(E) * q.n;
  const bool scales_ok = (!block && !channel) || (q.scales.dtype == DType::kF32 &&
                                                  q.scales.numel() == int64_t(scale_count) &&
                                                  q.scales.device == Device::kCuda);
  // Repacking a prepared stack again would scramble it.
  if (!is_fp8_experts(q) || fp8_data_repacked(q) || E <= 0 || q.n <= 0 || q.k <= 0 ||
      q.data.nbytes() != size_t(E) * q.n * q.k || q.data.device != Device::kCuda || !scales_ok ||
      (block && scale_count == 0))
    throw InvalidArgument(
        "cuda backend: " + what + ": " + std::string(weight_format_name(q.format)) + " stack of " +
        std::to_string(E) + " experts × " + std::to_string(q.n) + " × " + std::to_string(q.k) +
        " has inconsistent sizes (data " + std::to_string(q.data.nbytes()) + " B, scales " +
        std::to_string(q.scales.numel()) +
        " values), is not on the device or was prepared already");
  const MoeFp8Geometry geo{E, q.n, q.k, rows, k, gated};
  // Scales first: they validate the geometry before any device work.
  std::vector<float> host_scales(scale_count);
  if (scale_count > 0) backend.download(q.scales, host_scales.data());
  Tensor scales;
  if (block) {
    const std::vector<bf16> m =
        moe_fp8_block_multipliers(host_scales.data(), q.block_n, q.block_k, geo);
    scales = backend.upload(host_view(m.data(), DType::kBF16, {int64_t(m.size())}, nullptr));
  } else {
    const std::vector<float> r =
        moe_fp8_row_scales(channel ? host_scales.data() : nullptr, q.global_scale, geo);
    scales = backend.upload(host_view(r.data(), DType::kF32, {E, rows}, nullptr));
  }
  Tensor data = backend.empty(DType::kU8, {int64_t(kc::moe_fp8_data_bytes(E, rows, k))});
  kc::moe_fp8_repack({q.data.as<const uint8_t>(), data.as<uint8_t>(), E, q.n, q.k, rows, k, gated},
                     stream);
  adopt_repacked(q, data, scales, rows, k, cudaSuccess, stream, what);
}

MoeFp8Stack fp8_stack_view(const QuantizedWeight& q) {
  const bool block = q.format == kernels::WeightFormat::kFp8Block;
  const bool prepared =
      is_fp8_experts(q) && fp8_data_repacked(q) &&
      (block
           ? q.scales.dtype == DType::kBF16 &&
                 size_t(q.scales.numel()) == kernels::moe_fp8_multiplier_count(q.experts, q.n, q.k)
           : q.scales.dtype == DType::kF32 && q.scales.numel() == int64_t(q.experts) * q.n);
  if (!prepared)
    throw InvalidArgument(
        "moe_forward_cuda: FP8 experts were not prepared for CUDA (prepare_fp8_experts)");
  MoeFp8Stack s;
  s.codes = q.data.as<const uint8_t>();
  if (block) {
    s.multipliers = static_cast<const uint16_t*>(q.scales.data);
  } else {
    s.row_scales = q.scales.as<const float>();
  }
  return s;
}

void set_quantized_experts(const MoeWeights& w, MoeCudaArgs& a) {
  if (!w.gate_up_q || !w.down_q)
    throw InvalidArgument("moe_forward_cuda: quantized experts need both gate_up and down");
  if (is_fp8_experts(*w.gate_up_q)) {
    a.format = MoeExpertFormat::kFp8;
    a.gate_up_f8 = fp8_stack_view(*w.gate_up_q);
    a.down_f8 = fp8_stack_view(*w.down_q);
  } else {
    a.format = MoeExpertFormat::kNvfp4;
    a.gate_up_q = nvfp4_stack_view(*w.gate_up_q);
    a.down_q = nvfp4_stack_view(*w.down_q);
  }
}

void set_moe_routing(const MoeWeights& w, MoeCudaArgs& a) {
  a.routing = w.routing;
  a.renormalize = w.renormalize;
  a.correction_bias = w.correction_bias.data ? w.correction_bias.as<float>() : nullptr;
  a.num_groups = w.num_groups;
  a.topk_groups = w.topk_groups;
  a.routed_scaling_factor = w.routed_scaling_factor;
  a.local_offset = w.local_offset;
  a.num_local = w.num_local;
}

void moe_forward_cuda(const Tensor& x, const Tensor& router_logits, const MoeWeights& w,
                      Tensor& out, Backend& backend, cudaStream_t stream) {
  const bool quantized = w.gate_up_q.has_value();
  if (x.dtype != DType::kBF16 || out.dtype != DType::kBF16 || router_logits.dtype != DType::kF32 ||
      (!quantized && (w.gate_up.dtype != DType::kBF16 || w.down.dtype != DType::kBF16)) ||
      (quantized && !w.down_q))
    throw InvalidArgument(
        "moe_forward_cuda: needs bf16 x/out, f32 logits and bf16, NVFP4 or FP8 experts (got x " +
        std::string(dtype_name(x.dtype)) + ", experts " +
        (quantized ? std::string(weight_format_name(w.gate_up_q->format))
                   : std::string(dtype_name(w.gate_up.dtype))) +
        ")");
  MoeCudaArgs a;
  a.x = x.as<const bf16>();
  a.router_logits = router_logits.as<const float>();
  a.out = out.as<bf16>();
  if (quantized) {
    set_quantized_experts(w, a);
  } else {
    a.gate_up = w.gate_up.as<const bf16>();
    a.down = w.down.as<const bf16>();
  }
  a.num_tokens = int(x.dim(0));
  a.num_experts = w.num_experts;
  a.top_k = w.top_k;
  a.hidden = int(x.dim(1));
  a.inter = w.padded_inter > 0 ? w.padded_inter : w.inter;
  const int w_hidden = w.padded_hidden > 0 ? w.padded_hidden : w.hidden;
  if (w_hidden != a.hidden || out.dim(1) != a.hidden)
    throw InvalidArgument("moe_forward_cuda: x/out width " + std::to_string(a.hidden) +
                          " differs from the expert weights' hidden " + std::to_string(w_hidden));
  set_moe_routing(w, a);
  a.backend = parse_moe_backend(w.expert_backend);
  const size_t bytes = moe_workspace_bytes(a.num_tokens, a.top_k, a.num_local, a.hidden, a.inter);
  Tensor workspace = backend.empty(DType::kU8, {int64_t(bytes)});
  a.workspace = workspace.data;
  a.workspace_bytes = bytes;
  moe_forward_cuda(a, stream);
  // `workspace` is released here while the kernels may still be queued: the CUDA Backend's
  // allocator frees with cudaFreeAsync on the same stream, so the memory stays valid for them.
}

}  // namespace serval::backend::moe
#endif  // SERVAL_HAVE_CUDA
