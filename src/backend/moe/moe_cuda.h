// The MoE expert stages on CUDA, bf16, NVFP4 or FP8 expert weights: route → GEMM1 (+SwiGLU) → GEMM2
// → finalize, all on the device without host synchronisation (capturable in a CUDA graph).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "backend/moe/moe_hand_over.h"
#include "base/dtype.h"
#include "kernels/cuda/moe/moe_gemm.h"
#include "kernels/cuda/moe/moe_gemv_nvfp4.h"
#include "kernels/params.h"

namespace serval::backend::moe {

// `latency` (default): token tile 8..64 from tokens·top_k/num_local, 128×tile swap-AB tiles,
// 4 warps; with NVFP4 experts and at most 4 tokens, the GEMV kernels of
// kernels/cuda/moe/moe_gemv_nvfp4.h instead; steps with many tokens per expert (prefill) run the
// throughput kernels (moe_step_kernels). `throughput`: token tile 128, large tiles.
enum class MoeCudaBackend : uint8_t { kLatency, kThroughput };

// Expert weight storage of a layer on CUDA.
enum class MoeExpertFormat : uint8_t { kBf16, kNvfp4, kFp8 };

// One NVFP4 expert stack on the device in the repacked layout of
// kernels/cuda/moe/moe_nvfp4_repack.h (local experts only; rows and K padded like the bf16 path).
struct MoeNvfp4Stack {
  const uint8_t* codes = nullptr;        // repacked E2M1 codes, num_local · rows · k/2 bytes
  const uint8_t* scales = nullptr;       // repacked e4m3 block scales, num_local · rows · k/16
  const float* global_scales = nullptr;  // [num_local] f32: w = e2m1 · scale · global
};

// One FP8 (e4m3) expert stack on the device in the layout of kernels/moe_fp8_layout.h (local
// experts only, padded like the bf16 path) with its scales in the grouped GEMMs' form: block
// multipliers (block FP8) or one f32 scale per padded row (per-channel, per-tensor).
struct MoeFp8Stack {
  const uint8_t* codes = nullptr;         // num_local · rows · k bytes
  const uint16_t* multipliers = nullptr;  // bf16 bits, moe_fp8_multiplier_count(...) or null
  const float* row_scales = nullptr;      // [num_local, rows] or null
};

// True unless SERVAL_MOE_LATENCY_KERNELS_ONLY=1 (side-by-side comparisons): see
// MoeCudaArgs::large_steps_on_throughput.
bool moe_large_steps_on_throughput_default();

struct MoeCudaArgs {
  const bf16* x;               // [num_tokens, hidden], device
  const float* router_logits;  // [num_tokens, num_experts] fp32, device (caller's router GEMM)
  bf16* out;                   // [num_tokens, hidden], device; fully written
  const bf16* gate_up;  // [num_local, 2·inter, hidden]: rows [0, inter) gate, [inter, 2·inter) up
  const bf16* down;     // [num_local, hidden, inter]
  // kNvfp4: gate_up / down are ignored; gate_up_q has rows 2·inter (gate [0, inter), up
  // [inter, 2·inter)) × k hidden, down_q rows hidden × k inter.
  // kFp8: likewise gate_up_f8 / down_f8 (the grouped GEMMs only: no GEMV path).
  MoeExpertFormat format = MoeExpertFormat::kBf16;
  MoeNvfp4Stack gate_up_q, down_q;
  MoeFp8Stack gate_up_f8, down_f8;
  // W4A4 (kNvfp4 only; null: off): [num_local] f32 device global scales g = 1 / input_scale of
  // the expert inputs. GEMM1's input rows (gathered x) and GEMM2's (SwiGLU's output) are then
  // NVFP4-quantized and dequantized per expert (kernels/cuda/quant/nvfp4_expert_rows.h), as
  // kernels::cpu::nvfp4_fake_quant_rows does in moe_forward_cpu; such steps run the grouped
  // GEMMs, never the few-token GEMVs.
  const float* gate_up_act_scales = nullptr;
  const float* down_act_scales = nullptr;
  const float* correction_bias = nullptr;  // [num_experts] (grouped routing only) or null
  int num_tokens = 0, num_experts = 0, top_k = 0, hidden = 0, inter = 0;
  kernels::RoutingMethod routing = kernels::RoutingMethod::kSoftmaxTopK;
  bool renormalize = true;
  int num_groups = 1, topk_groups = 1;
  float routed_scaling_factor = 1.0f;
  // This rank's experts [local_offset, local_offset + num_local); others contribute zero.
  int local_offset = 0, num_local = 0;
  MoeCudaBackend backend = MoeCudaBackend::kLatency;
  // Latency backend: steps past its tokens per expert limit (moe_hand_over.h) run the throughput
  // kernels (false: always the latency kernels, for tests and benchmarks of the kernels).
  bool large_steps_on_throughput = moe_large_steps_on_throughput_default();
  void* workspace = nullptr;  // device, 256-byte aligned, moe_workspace_bytes(...) bytes
  size_t workspace_bytes = 0;
  // True: an earlier kernel on `stream` (kernels/cuda/moe/moe_norm_router.h) already wrote this
  // call's routing into the workspace (topk ids/weights and maps at moe_workspace_view(*this),
  // with its tile), so moe_forward_cuda skips the routing kernel; router_logits is not read.
  bool routed = false;
  // True (with routed false): an earlier kernel wrote router_logits but no routing, and the
  // NVFP4 expert GEMVs route per CTA from them (moe_runs_gemv must hold); no routing kernel runs.
  bool route_in_gemv = false;
  // Set (residual non-null): the residual add + RMSNorm after the block, fused into its finalize
  // where the call ends with one (kernels::cuda::MoeNextNorm); `out` is then not written.
  // moe_forward_cuda reports whether it did.
  kernels::cuda::MoeNextNorm next_norm;
};

// Token tile of the latency backend: nextPow2(ceil(tokens·top_k / num_local)) in [8, 64].
int moe_latency_tile(int num_tokens, int top_k, int num_local);

// The kernels a call runs: a.backend, except a latency step past its tokens per expert limit
// (moe_hand_over.h; and a.large_steps_on_throughput) runs the throughput kernels.
MoeCudaBackend moe_step_kernels(const MoeCudaArgs& a);

// Whether moe_forward_cuda runs `a` on the few-token NVFP4 expert GEMVs (kernels/cuda/moe/
// moe_gemv_nvfp4.h) rather than the grouped GEMMs.
bool moe_runs_gemv(const MoeCudaArgs& a);

// Whether `a` quantizes its expert inputs (W4A4: gate_up_act_scales or down_act_scales set).
bool moe_quantizes_activations(const MoeCudaArgs& a);

// Workspace for any num_tokens ≤ max_tokens with either backend.
size_t moe_workspace_bytes(int max_tokens, int top_k, int num_local, int hidden, int inter);

// Device-side pieces of the workspace for one call (the routing maps, for tests and tools).
struct MoeWorkspaceView {
  int32_t* topk_ids;              // [T, top_k]
  float* topk_weights;            // [T, top_k]
  int32_t* expanded_to_permuted;  // [T · top_k]
  int32_t* permuted_to_token;     // [max_rows]
  int32_t* tile_expert;           // [max_tiles]
  int32_t* num_tiles;             // [1]
  int32_t* chunk_counts;          // [kMoeMaxMapChunks, num_local]: the map builder's scratch
  int32_t* gemm1_rows;            // [max_rows]: W4A4, GEMM1's map over its quantized input rows
  bf16* act;                      // [max_rows, inter]
  bf16* y;                        // [max_rows, hidden]; W4A4: GEMM1's input rows until GEMM2
  int tile, max_tiles, max_rows;
};
MoeWorkspaceView moe_workspace_view(const MoeCudaArgs& a);

// The two grouped GEMMs moe_forward_cuda runs for `a` on its workspace (GEMM1 x → ws.act with
// SwiGLU, GEMM2 ws.act → ws.y; the kernels of moe_step_kernels(a)); tests run them directly on
// the maps an earlier call left. Throws InvalidArgument for NVFP4 experts missing codes or scales.
struct MoeGroupedGemms {
  kernels::cuda::MoeGemmParams gemm1, gemm2;
};
MoeGroupedGemms moe_grouped_gemm_params(const MoeCudaArgs& a, const MoeWorkspaceView& ws);

// The few-token NVFP4 expert GEMVs' parameters for `a` (moe_runs_gemv) on its workspace: the
// routing kernel's ids and weights, ws.act as the activations' scratch.
kernels::cuda::MoeGemvNvfp4Params moe_gemv_params(const MoeCudaArgs& a, const MoeWorkspaceView& ws);

// Enqueues the whole layer on `stream`. Returns true when it also ran the next add + norm
// (a.next_norm set and the layer ended with the finalize kernel; `out` then unwritten), false
// when it wrote `out` only. Throws InvalidArgument for unsupported shapes (hidden % 128, inter %
// 64, num_experts ≤ 256, top_k ≤ 32) or a too-small workspace.
bool moe_forward_cuda(const MoeCudaArgs& a, cudaStream_t stream);

// Repacks one uploaded NVFP4 expert stack (device tensors in checkpoint layout: data
// [E, n, k/2], scales e4m3 [E, n, k/16]; global_scale on the host, one per expert) into the
// layout the CUDA expert GEMMs read, zero-padding to `rows` × `k` (gated: gate_up, each half
// padded to rows/2). Afterwards q.data is u8 [E · rows · k/2] (repacked codes), q.scales is u8
// [align256(E · rows · k/16) + 4·E] (repacked block scales, then the f32 global scales at byte
// align256(E · rows · k/16)), q.n = rows, q.k = k. Synchronises `stream` (load time only).
// Throws InvalidArgument naming `what` for a format other than NVFP4 or inconsistent shapes.
void prepare_nvfp4_experts(QuantizedWeight& q, bool gated, int rows, int k, Backend& backend,
                           cudaStream_t stream, const std::string& what);
// Device pointers of a stack prepared by prepare_nvfp4_experts.
MoeNvfp4Stack nvfp4_stack_view(const QuantizedWeight& q);

// Repacks one uploaded FP8 expert stack (device tensors in checkpoint layout: data e4m3
// [E, n, k]; scales f32 [E, ceil(n/bn), ceil(k/bk)] (block) or [E, n] (per-channel); per-tensor
// scales in global_scale on the host) into the layout the CUDA expert GEMMs read, zero-padding
// to `rows` × `k` as prepare_nvfp4_experts does. Afterwards q.data is u8 [E · rows · k] and
// q.scales is bf16 block multipliers [moe_fp8_multiplier_count(E, rows, k)] (block) or f32 row
// scales [E, rows] (per-channel, per-tensor); q.n = rows, q.k = k. Synchronises `stream` (load
// time only). Throws InvalidArgument naming `what` for inconsistent shapes or scales the GEMMs
// cannot apply (backend/moe/moe_fp8_scales.h).
void prepare_fp8_experts(QuantizedWeight& q, bool gated, int rows, int k, Backend& backend,
                         cudaStream_t stream, const std::string& what);
// Device pointers of a stack prepared by prepare_fp8_experts.
MoeFp8Stack fp8_stack_view(const QuantizedWeight& q);

// Whether the expert stack is FP8 (any scale granularity).
bool is_fp8_experts(const QuantizedWeight& q);

// The quantized expert stacks of w (prepared by prepare_nvfp4_experts or prepare_fp8_experts)
// and their format into a. Throws InvalidArgument for unprepared stacks.
void set_quantized_experts(const MoeWeights& w, MoeCudaArgs& a);

// The routing of w (method, renormalization, groups, selection bias, scaling) and its local
// expert slice into a.
void set_moe_routing(const MoeWeights& w, MoeCudaArgs& a);

// Tensor form for the CUDA Backend: x [T, hidden] bf16, router_logits [T, num_experts] f32,
// out [T, hidden] bf16, weights of `w` on the device in bf16, or NVFP4 / FP8 (w.gate_up_q /
// w.down_q prepared by prepare_nvfp4_experts / prepare_fp8_experts); w.expert_backend picks the
// backend. Padded weights (w.padded_inter) are used as is (zero rows/columns add nothing);
// w.padded_hidden must equal x's width. The workspace comes from `backend.empty(...)` per call (a
// graph-captured caller should use the MoeCudaArgs form with a persistent workspace).
void moe_forward_cuda(const Tensor& x, const Tensor& router_logits, const MoeWeights& w,
                      Tensor& out, Backend& backend, cudaStream_t stream);

// "latency" / "throughput" → enum; anything else throws InvalidArgument listing the choices.
MoeCudaBackend parse_moe_backend(const std::string& name);

}  // namespace serval::backend::moe
