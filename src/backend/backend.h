// The Backend interface: the ops a model needs, on tensors of one device.
#pragma once
#include <cctype>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "kernels/params.h"
#include "tensor/tensor.h"

namespace serval::backend {

// Per-step attention metadata, built once on the host and uploaded once; layers only read it.
struct StepMetadata {
  Tensor token_ids;       // [num_tokens] i32
  Tensor positions;       // [num_tokens] i32
  Tensor slot_mapping;    // [num_tokens] i32: block · block_size + offset
  Tensor query_start;     // [num_seqs + 1] i32
  Tensor context_lens;    // [num_seqs] i32
  Tensor block_tables;    // [num_seqs, max_blocks_per_seq] i32
  Tensor logits_indices;  // [num_logits] i32: token rows whose logits are returned
  Tensor packed;          // i32: the arrays above are views into it (one copy uploads them)
  int num_tokens = 0, num_seqs = 0, max_blocks_per_seq = 0, num_logits = 0;
  int max_query_len = 0, max_context_len = 0;  // host-side bounds for kernel selection
  // Data parallel with expert parallel (model::ShardSpec::dp_moe): this replica's tokens are
  // rows [dp_row_offset, + num_tokens) of the dp_rows_total rows every MoE layer runs on.
  int dp_row_offset = 0, dp_rows_total = 0;
};

// One layer's paged KV cache: [num_blocks, block_size, num_kv_heads, head_dim] each.
struct KvCacheLayer {
  Tensor k, v;
  int block_size = 0;
  float k_scale = 1.0f, v_scale = 1.0f;
};

// A quantized linear weight (or a stack of MoE experts' weights) on the backend's device.
// Element (e, r, c) dequantizes as kernels::QuantLinearParams states, with expert e's scales.
struct QuantizedWeight {
  kernels::WeightFormat format = kernels::WeightFormat::kNvfp4;
  int experts = 0;  // 0: one linear [n, k]; E > 0: a stack, every tensor gains a leading [E]
  int n = 0, k = 0;
  Tensor data;    // NVFP4 u8 [n, k/2] (element 2i low nibble); FP8 e4m3 [n, k]
  Tensor scales;  // NVFP4 e4m3 [n, k/16]; per-channel f32 [n]; block f32 [ceil(n/bn), ceil(k/bk)];
                  // per-tensor: undefined
  // One entry per expert (one for a plain linear): the NVFP4 weight_scale_2 multiplier or the
  // FP8 per-tensor weight_scale (1.0 otherwise), and the static activation scale (1.0 if none).
  std::vector<float> global_scale, input_scale;
  int block_n = 0, block_k = 0;  // FP8 block tile
  // W4A4 (NVFP4 only): the input rows are NVFP4-quantized with global scale 1/input_scale
  // before the product (kernels::cpu::nvfp4_fake_quant_rows gives the exact values).
  bool quantize_activations = false;
  Tensor activation_scale;  // CUDA W4A4: device f32 [1] holding 1/input_scale (set at upload)
  // A SwiGLU MLP's gate/up weight (rows [0, n/2) gate, [n/2, n) up), marked by the loader before
  // upload: a backend may keep its rows in an order of its own (rows_reordered), so such a weight
  // is only ever used through Backend::linear_silu_mul.
  bool gate_up = false;
  bool rows_reordered = false;  // set by the backend's upload (CUDA: quant_gemm's gate/up tiling)
  // Bytes of one expert's (or the linear's) data and scales.
  size_t data_bytes() const { return data.nbytes() / size_t(experts > 0 ? experts : 1); }
  size_t scale_bytes() const { return scales.nbytes() / size_t(experts > 0 ? experts : 1); }
};

inline std::string_view weight_format_name(kernels::WeightFormat f) {
  switch (f) {
    case kernels::WeightFormat::kNvfp4:
      return "NVFP4";
    case kernels::WeightFormat::kFp8PerTensor:
      return "FP8 (per-tensor)";
    case kernels::WeightFormat::kFp8PerChannel:
      return "FP8 (per-channel)";
    case kernels::WeightFormat::kFp8Block:
      return "FP8 (block)";
  }
  return "?";
}

// A linear layer's weight: dense [n, k] in a float dtype, or quantized.
struct Weight {
  Tensor dense;
  std::optional<QuantizedWeight> q;
  bool quantized() const { return q.has_value(); }
  int64_t out_features() const { return q ? q->n : dense.dim(0); }
};

// Experts of one MoE layer, all on the backend's device.
struct MoeWeights {
  Tensor router;  // [num_experts, hidden]
  // The local experts (num_local of them; all when not expert parallel):
  Tensor gate_up;  // [num_local, 2 * inter, hidden]: rows [0, inter) gate, [inter, 2·inter) up
  Tensor down;     // [num_local, hidden, inter]
  // Quantized experts: when set, they replace gate_up / down (which stay undefined), with the
  // same row layouts and experts == num_experts.
  std::optional<QuantizedWeight> gate_up_q, down_q;
  int num_experts = 0, top_k = 0, hidden = 0, inter = 0;
  kernels::RoutingMethod routing = kernels::RoutingMethod::kSoftmaxTopK;
  bool renormalize = true;
  // kSigmoidGroupedTopK (DeepSeek-V3): the selection bias f32 [num_experts] (undefined: none),
  // the expert groups and how many of them a token picks from.
  Tensor correction_bias;
  int num_groups = 1, topk_groups = 1;
  float routed_scaling_factor = 1.0f;  // every routed weight is multiplied by it (DeepSeek)
  // Expert-parallel slice: this rank holds experts [local_offset, local_offset + num_local).
  int local_offset = 0, num_local = 0;
  // Expert backend of this layer: "latency" or "throughput" (SPEC §1).
  std::string expert_backend = "latency";
  // Set by Backend::prepare_moe when the device layout pads the weights (zero rows/columns):
  // gate_up [E, 2·padded_inter, padded_hidden], down [E, padded_hidden, padded_inter].
  int padded_hidden = 0, padded_inter = 0;
};

// Dummy weights (--load-format dummy) made where they live, from a small description instead
// of host values (Backend::dummy_dense / dummy_quantized). Random values come from
// kernels::dummy_uniform(key, counter) (kernels/dummy_random.h).
//
// A run of rows of a dense dummy tensor: element (r, c) of the run (r < rows) takes
// v = center + (2u − 1)·half_width with u = dummy_uniform(key, offset + r·row_stride + c), so a
// run can reproduce any row/column slice of a whole tensor generated with offset 0.
struct DummyBlock {
  int64_t rows = 0;
  uint64_t key = 0;
  int64_t offset = 0, row_stride = 0;
  float center = 0.0f, half_width = 0.0f;
};
// A dense dummy weight: shape `shape` viewed as [numel / cols, cols], filled by `blocks` in row
// order (their rows sum to numel / cols). Values are rounded to `dtype` (the dtype the host
// source produces: f32, bf16 or f16), then stored as upload_weight would store that tensor.
struct DummyDense {
  DType dtype = DType::kBF16;
  Shape shape;
  int64_t cols = 0;
  std::vector<DummyBlock> blocks;
};

// Per-layer constants of the attention core.
struct AttentionParams {
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;  // softmax scale
  float rms_norm_eps = 1e-6f;
  const Tensor* q_norm = nullptr;  // [head_dim] or null
  const Tensor* k_norm = nullptr;
  const Tensor* inv_freq = nullptr;  // [head_dim / 2] f32
};

// Per-layer constants of MLA attention (the absorbed form of kernels::MlaPrepareParams).
struct MlaParams {
  int num_heads = 0, latent_dim = 0, rope_dim = 0;
  int q_stride = 0, q_rope_offset = 0;  // q projection: values per head, its rope part's offset
  float scale = 1.0f;                   // softmax scale
  float rms_norm_eps = 1e-6f;           // of kv_norm
  float rope_scale = 1.0f;              // rotated vectors are multiplied by it (YaRN)
  bool rope_interleaved = false;
  const Tensor* kv_norm = nullptr;   // [latent_dim]
  const Tensor* inv_freq = nullptr;  // [rope_dim / 2] f32
};

// A quantized dummy linear or expert stack. `meta` holds everything but the tensors (format,
// experts, n, k, global_scale / input_scale per expert, block_n / block_k,
// quantize_activations). The host equivalent, in checkpoint layout, is: data NVFP4 u8
// [E?, n, k/2] = kernels::cpu::dummy_bits(data_key); FP8 e4m3 [E?, n, k] =
// dummy_fp8(data_key, fp8_half_width); scales NVFP4 e4m3 [E?, n, k/16] =
// dummy_codes(scale_key, sf_code_lo, sf_code_hi); FP8 per-channel f32 [E?, n] and block f32
// [E?, ceil(n/block_n), ceil(k/block_k)] all fp8_scale; FP8 per-tensor none. Keys are per
// tensor: a backend may lay the random values out in its own order (only their distribution
// and the zero padding of its layout matter).
struct DummyQuantized {
  QuantizedWeight meta;
  uint64_t data_key = 0, scale_key = 0;
  uint8_t sf_code_lo = 0, sf_code_hi = 0;
  float fp8_half_width = 448.0f;
  float fp8_scale = 1.0f;
};

// A point in the device's queue of work (a CUDA event): wait() returns once everything enqueued
// before the latest record() has finished. Where calls finish before returning (the CPU), both
// are no-ops.
class StreamMark {
 public:
  virtual ~StreamMark() = default;
  virtual void record() {}
  virtual void wait() {}
};

// A recorded sequence of device work (a CUDA graph) that can be replayed on the same buffers.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // The device stream collectives must be ordered on (a cudaStream_t on CUDA); null on the CPU.
  virtual void* native_stream() { return nullptr; }
  // Activations dtype of this backend (f32 on the CPU, bf16 on CUDA).
  virtual DType activation_dtype() const = 0;
  // Element type of the paged KV cache.
  virtual DType kv_cache_dtype() const = 0;

  virtual Tensor empty(DType dtype, Shape shape) = 0;
  // Copies a host tensor to the device as is (a no-op view on the CPU backend).
  virtual Tensor upload(const Tensor& host) = 0;
  // Copies a float weight to the device in the dtype the backend computes with (bf16 on CUDA;
  // the CPU backend reads bf16, f16 and f32 weights in place).
  virtual Tensor upload_weight(const Tensor& host) = 0;
  // Moves a host quantized weight to the device in a layout this backend's quantized GEMMs read.
  // The default throws InvalidArgument: the backend has no kernels for quantized weights.
  virtual QuantizedWeight upload_quantized(const QuantizedWeight& host);
  // Whether dummy_dense / dummy_quantized generate on the device (no host values, no copies of
  // weight bytes). The loader uses them for dummy weights only when this is true.
  virtual bool generates_dummy_weights() const { return false; }
  // The weight upload_weight returns for a host tensor filled per `d`. The default fills host
  // memory (kernels::cpu::dummy_dense) and calls upload_weight.
  virtual Tensor dummy_dense(const DummyDense& d);
  // What upload_quantized returns for a host weight with `d`'s values (see DummyQuantized; the
  // device layout's padding stays zero). The default fills the host checkpoint layout and calls
  // upload_quantized.
  virtual QuantizedWeight dummy_quantized(const DummyQuantized& d);
  // Bytes free and total on the device.
  virtual void memory_info(int64_t* free_bytes, int64_t* total_bytes) = 0;
  // Copies a device tensor into host memory of the same byte size.
  virtual void download(const Tensor& src, void* dst) = 0;
  // Fills a tensor with zeros.
  virtual void zero(Tensor& t) = 0;
  // Copies t.nbytes() host bytes into an existing device tensor (ordered with the step's work).
  // From host_staging memory the copy may still be queued on return: keep `src` unchanged until
  // a StreamMark recorded after the call has passed.
  virtual void copy_to_device(const void* src, Tensor& dst) = 0;
  // Host memory that device copies use without waiting for the device (pinned on CUDA), at least
  // `bytes` long (> 0); freed when its last owner lets go.
  virtual std::shared_ptr<void> host_staging(size_t bytes) {
    return std::shared_ptr<void>(::operator new(bytes), [](void* p) { ::operator delete(p); });
  }
  // Queues the copy of a device tensor into `dst` (host_staging memory of src.nbytes() bytes or
  // more) and returns: the bytes are there once a StreamMark recorded after this call has passed.
  // The default waits for them (download).
  virtual void download_async(const Tensor& src, void* dst) { download(src, dst); }
  // A mark on this backend's queue of work (see StreamMark), not yet recorded.
  virtual std::unique_ptr<StreamMark> make_mark() { return std::make_unique<StreamMark>(); }

  // Step-scoped memory. After reserve_step_memory(bytes), every empty() between two
  // begin_step() calls comes from one arena in allocation order, so a step makes no driver calls
  // and repeats the same addresses (what CUDA graph replay needs). Tensors allocated in a step
  // are valid until the next begin_step(). end_step() returns empty() to ordinary allocation.
  // The CPU backend ignores all three.
  virtual void reserve_step_memory(int64_t bytes) {}
  // Waits until every operation queued so far has finished (a no-op where calls complete
  // before returning, as on the CPU).
  virtual void synchronize() {}
  // What the thread driving this backend is doing now, for diagnostics (a parallel step that
  // stalls reports every rank's): the op being enqueued or the wait in progress; empty between
  // calls and where the backend does not track it. Safe to call from any thread.
  virtual std::string activity() const { return {}; }
  virtual void begin_step() {}
  virtual void end_step() {}
  // Scoped reuse inside a step: tensors allocated after step_mark() are dead after
  // step_release(mark) (a layer's temporaries), and their memory is handed out again.
  virtual int64_t step_mark() { return 0; }
  virtual void step_release(int64_t mark) {}
  // Records the device work `record` enqueues as a graph (inside begin_step/end_step); null when
  // the backend has no graphs or the capture failed (the caller then runs eagerly).
  virtual std::unique_ptr<StepGraph> capture(const std::function<void()>& record) {
    return nullptr;
  }
  // True inside capture()'s record (the device work is recorded, not run).
  virtual bool capturing() const { return false; }

  // out[t] = table[ids[t]]; out: [num_tokens, hidden]
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  // out = rms_norm(x (+ residual)) · w; with residual, residual += x first.
  virtual void rms_norm(const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                        Tensor& out) = 0;
  // y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) = 0;
  // Same for a Weight: the dense path above, or the quantized GEMM (quantized_linear).
  void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y) {
    if (w.q) {
      quantized_linear(x, *w.q, bias, y);
    } else {
      linear(x, w.dense, bias, y);
    }
  }
  // y[m, n] = x[m, k] · dequant(w)ᵀ (+ bias[n]); w a single linear (experts == 0). The default
  // throws InvalidArgument (see upload_quantized).
  virtual void quantized_linear(const Tensor& x, const QuantizedWeight& w, const Tensor* bias,
                                Tensor& y);
  // The attention core of one layer, after the fused QKV projection:
  // qkv [T, (Hq + 2·Hkv)·D] (per row: q heads, k heads, v heads) → per-head RMSNorm of q and k
  // (when the norms are given), neox RoPE with inv_freq [D/2] at meta.positions, K/V appended to
  // the paged cache at meta.slot_mapping, causal paged attention → out [T, Hq·D].
  virtual void attention(const Tensor& qkv, const AttentionParams& p, KvCacheLayer& cache,
                         const StepMetadata& meta, Tensor& out) = 0;
  // The MLA attention core of one layer (kernels::MlaPrepareParams states the math):
  // q [T, H·q_stride] the q projection (its rope parts are read), q_lat [T, H·latent] its no-rope
  // parts taken into the latent space (head_linear), kv [T, latent + rope] the kv_a projection →
  // the tokens' rows appended to cache.k ([num_blocks, block_size, 1, latent + rope]; cache.v is
  // not used, the values are the rows' latent part) at meta.slot_mapping, then causal attention
  // → out [T, H·latent]. An fp8 cache stores rows / k_scale.
  virtual void mla_attention(const Tensor& q, const Tensor& q_lat, const Tensor& kv,
                             const MlaParams& p, KvCacheLayer& cache, const StepMetadata& meta,
                             Tensor& out) = 0;
  // One small linear per head: y[t, h·n + i] = Σ_j w[h, i, j] · x[t, h·x_stride + j] (j < k), for
  // w [H, n, k], x [T, H·x_stride] with x_stride ≥ k, y [T, H·n].
  virtual void head_linear(const Tensor& x, int x_stride, const Tensor& w, Tensor& y) = 0;
  // out += x, elementwise (same shapes, the activation dtype).
  virtual void add(const Tensor& x, Tensor& out) = 0;
  // out[r] = silu(x[r, :I]) · x[r, I:]
  virtual void silu_mul(const Tensor& x, Tensor& out) = 0;
  // out = x as fp32; x in the activation dtype, out kF32 of the same shape.
  virtual void to_float(const Tensor& x, Tensor& out) = 0;
  // out[r, :] += sigmoid(gate[r]) · x[r, :]; gate [R, 1], x and out [R, C] (a gated shared
  // expert's output added to the routed experts' sum).
  virtual void sigmoid_gate_add(const Tensor& gate, const Tensor& x, Tensor& out) = 0;
  // out [T, I] = silu(x · gateᵀ) · (x · upᵀ) for a gate/up weight [2I, k] (QuantizedWeight::
  // gate_up when quantized). The default runs linear and silu_mul through a [T, 2I] temporary; a
  // backend may fuse them (the CUDA backend does in its quantized decode GEMV).
  virtual void linear_silu_mul(const Tensor& x, const Weight& gate_up, Tensor& out) {
    Tensor h = empty(activation_dtype(), {x.dim(0), gate_up.out_features()});
    linear(x, gate_up, nullptr, h);
    silu_mul(h, out);
  }
  // Converts uploaded MoE weights to the layout this backend's expert kernels need (once, at
  // load time). Throws InvalidArgument naming the case if the layer cannot run here.
  virtual void prepare_moe(MoeWeights& w) = 0;
  // out[T, hidden] = Σ_k weight_k · expert_k(x) over the routed experts held locally.
  virtual void moe(const Tensor& x, const MoeWeights& w, Tensor& out) = 0;
  // An MoE block with the norm before it: residual += delta, x = rms_norm(residual) · norm_w (as
  // rms_norm with a residual), then out = moe(x, w). x is left holding the experts' input.
  // out may alias delta. The default runs the two ops; a backend may fuse the norm, the router
  // linear and the routing (the CUDA backend does for a few tokens).
  // With next_norm, a backend may also run the add + norm that follows the block, as
  // rms_norm(out, &residual, *next_norm, eps, x) does, and return true: then residual holds the
  // sum and x the next block's input (out may or may not have been written). Returns false when
  // it did not. The default runs that norm itself (so every backend takes the caller's path for
  // it; the CUDA backend fuses it into the MoE finalize).
  virtual bool add_rms_norm_moe(const Tensor& delta, Tensor& residual, const Tensor& norm_w,
                                float eps, Tensor& x, const MoeWeights& w, Tensor& out,
                                const Tensor* next_norm) {
    rms_norm(delta, &residual, norm_w, eps, x);
    moe(x, w, out);
    if (next_norm == nullptr) return false;
    rms_norm(out, &residual, *next_norm, eps, x);
    return true;
  }
  // out[r] = argmax over logits[r, :] (ties: lowest index); logits [R, V] f32, out [R] i32.
  virtual void argmax(const Tensor& logits, Tensor& out) = 0;
  // out[i] = x[rows[i]]
  virtual void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) = 0;
  // Pending token ids (async scheduling): ids[i] = sampled[−ids[i] − 1] where ids[i] < 0, the ids
  // the previous greedy step sampled, taken where they are; other ids stay. ids [N] and sampled
  // [R] i32; the caller has checked every pending id against R.
  virtual void resolve_pending_tokens(Tensor& ids, const Tensor& sampled) = 0;
};

inline QuantizedWeight Backend::upload_quantized(const QuantizedWeight& host) {
  std::string dev = name();
  for (char& ch : dev) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  const std::string fmt(weight_format_name(host.format));
  throw InvalidArgument(name() + " backend: " + fmt + " weights need the " + dev + " " + fmt +
                        " GEMM, not built yet (the CPU backend runs them: --device cpu)");
}

inline void Backend::quantized_linear(const Tensor&, const QuantizedWeight& w, const Tensor*,
                                      Tensor&) {
  upload_quantized(w);  // throws the same message
}

std::unique_ptr<Backend> make_cpu_backend();
// Null when serval was built without CUDA or no GPU is present.
std::unique_ptr<Backend> make_cuda_backend();
bool cuda_available();

}  // namespace serval::backend
