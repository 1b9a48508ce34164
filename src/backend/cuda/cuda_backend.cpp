// The CUDA backend: bf16 activations and weights, bf16 paged KV cache, one stream, memory from
// the stream-ordered allocator (freed memory is kept in the pool, so steady-state steps do not
// call into the driver).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_mla_call.h"
#include "backend/cuda/cuda_moe_call.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "backend/cuda/op_profiler.h"
#include "backend/cuda/op_timeline.h"
#include "backend/cuda/pinned_upload.h"
#include "backend/cuda/quantized_pack.h"
#include "backend/cuda/step_graph.h"
#include "backend/cuda/stream_mark.h"
#include "backend/cuda/tensor_data.h"
#include "backend/moe/moe_cuda.h"
#include "base/env.h"
#include "base/log.h"
#include "base/math.h"
#include "base/thread_pool.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/head_linear.h"
#include "kernels/cuda/gemm/quant_gemm.h"
#include "kernels/cuda/gemm/quant_gemv.h"
#include "kernels/cuda/init/dummy_init.h"
#include "kernels/cuda/misc/elementwise.h"
#include "kernels/cuda/misc/timeline_probe.h"
#include "kernels/cuda/moe/moe_gemm.h"
#include "kernels/cuda/moe/moe_norm_router.h"
#include "kernels/cuda/norm_rope/qk_norm_rope_kv.h"
#include "kernels/cuda/norm_rope/rms_norm.h"
#include "kernels/cuda/quant/nvfp4_dequant.h"
#include "kernels/cuda/quant/nvfp4_quant.h"
#include "kernels/cuda/sampling/argmax.h"
#include "kernels/cuda/sampling/pending_tokens.h"

namespace serval::backend {

namespace {

using cuda::cuda_check;

using cuda::bf;
using cuda::bf_mut;
using cuda::expect;

// The stream every backend enqueues on. It lives as long as the process: tensors free their
// memory with cudaFreeAsync on it from their deleters, which may run after the backend that
// made them is gone (a destroyed stream there crashes the driver).
// One per device (the calling thread's current one): tensor-parallel ranks each bind their own
// GPU before creating their backend.
cudaStream_t process_stream() {
  static std::mutex mu;
  static std::vector<cudaStream_t> streams;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard lock(mu);
  if (streams.size() <= size_t(device)) streams.resize(size_t(device) + 1, nullptr);
  if (!streams[size_t(device)])
    cuda_check(cudaStreamCreateWithFlags(&streams[size_t(device)], cudaStreamNonBlocking),
               "cudaStreamCreate");
  return streams[size_t(device)];
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() : stream_(process_stream()) {
    cudaMemPool_t pool;
    cuda_check(cudaGetDevice(&device_), "cudaGetDevice");
    cuda_check(cudaDeviceGetDefaultMemPool(&pool, device_), "cudaDeviceGetDefaultMemPool");
    uint64_t keep_all = UINT64_MAX;
    cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
               "cudaMemPoolSetAttribute");
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    profiler_.collect(stream_);
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "cuda"; }
  void* native_stream() override { return stream_; }
  DType activation_dtype() const override { return DType::kBF16; }
  DType kv_cache_dtype() const override { return DType::kBF16; }

  Tensor empty(DType dtype, Shape shape) override {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.device = Device::kCuda;
    const size_t bytes = round_up<size_t>(std::max<size_t>(t.nbytes(), 16), 256);
    if (in_step_) {
      if (arena_offset_ + bytes <= size_t(arena_.nbytes())) {
        t.data = static_cast<char*>(arena_.data) + arena_offset_;
        t.storage = arena_.storage;  // freed with the arena, never per tensor
        arena_offset_ += bytes;
        return t;
      }
      if (!warned_arena_ && !capturing_) {
        log::warn("step arena ({} MiB) too small for a step; using the allocator",
                  arena_.nbytes() >> 20);
        warned_arena_ = true;
      }
    }
    // Allocations inside a capture would become graph memory nodes that the graph never frees
    // (the tensors outlive it), so its second launch would fail: captures use the arena only.
    if (capturing_)
      throw OutOfResources(arena_.data ? "step arena too small for CUDA graph capture"
                                       : "CUDA graph capture needs a step arena "
                                         "(Backend::reserve_step_memory)");
    void* p = nullptr;
    cudaError_t e = cudaMallocAsync(&p, bytes, stream_);
    if (e != cudaSuccess) {
      throw OutOfResources("GPU allocation of " + std::to_string(bytes) +
                           " bytes failed: " + cudaGetErrorString(e));
    }
    cudaStream_t stream = stream_;
    t.storage = std::shared_ptr<void>(p, [stream](void* q) { cudaFreeAsync(q, stream); });
    t.data = p;
    return t;
  }

  void reserve_step_memory(int64_t bytes) override {
    in_step_ = false;
    arena_ = Tensor{};
    arena_ = empty(DType::kU8, {bytes});
  }
  bool capturing() const override { return capturing_; }
  void synchronize() override {
    cuda::ActivityScope activity(profiler_, "synchronize (waiting for the GPU)");
    cuda_check(cudaStreamSynchronize(stream_), "synchronize");
  }
  std::string activity() const override {
    const char* a = profiler_.activity();
    return a ? a : "";
  }
  void begin_step() override {
    in_step_ = arena_.data != nullptr;
    arena_offset_ = 0;
    timeline_.restart(stream_);
  }
  void end_step() override {
    if (!capturing_) timeline_.collect(stream_);
    in_step_ = false;
    if (!capturing_) profiler_.collect(stream_);
  }
  int64_t step_mark() override { return int64_t(arena_offset_); }
  void step_release(int64_t mark) override {
    if (in_step_ && size_t(mark) <= arena_offset_) arena_offset_ = size_t(mark);
  }

  std::unique_ptr<StepGraph> capture(const std::function<void()>& record) override {
    cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    capturing_ = true;
    std::string error;
    try {
      timeline_.restart(stream_);  // the graph's own marks, from slot 0
      record();
    } catch (const std::exception& e) {
      error = e.what();
    }
    capturing_ = false;
    std::vector<const char*> marks = timeline_.take_marks();
    cudaGraph_t graph = nullptr;
    cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!error.empty() || end != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();  // clear the capture error
      log::warn("CUDA graph capture failed ({}); this batch size runs eagerly",
                error.empty() ? cudaGetErrorString(end) : error);
      return nullptr;
    }
    cudaGraphExec_t exec = nullptr;
    cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    return std::make_unique<cuda::CudaStepGraph>(graph, exec, stream_, timeline_, std::move(marks));
  }

  // Weights of 8 MB and more go through the pinned double buffer (pinned_upload.h).
  Tensor upload(const Tensor& host) override {
    Tensor t = empty(host.dtype, host.shape);
    if (host.nbytes() >= (size_t{8} << 20)) {
      uploader_.copy(t.data, host.data, host.nbytes(), stream_);
      return t;
    }
    cuda_check(cudaMemcpyAsync(t.data, host.data, host.nbytes(), cudaMemcpyHostToDevice, stream_),
               "upload");
    cuda_check(cudaStreamSynchronize(stream_), "upload sync");  // host memory may be freed next
    return t;
  }

  Tensor upload_weight(const Tensor& host) override {
    if (host.dtype == DType::kBF16) return upload(host);
    Tensor converted = host_empty(DType::kBF16, host.shape);
    ThreadPool::global().parallel_for(host.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        converted.as<bf16>()[i] = float_to_bf16(load_as_float(host.data, host.dtype, size_t(i)));
    });
    return upload(converted);
  }

  void memory_info(int64_t* free_bytes, int64_t* total_bytes) override {
    size_t f = 0, t = 0;
    cuda_check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *free_bytes = int64_t(f);
    *total_bytes = int64_t(t);
  }

  void download(const Tensor& src, void* dst) override {
    cuda::ActivityScope activity(profiler_, "download (waiting for the GPU)");
    cuda_check(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_),
               "download");
    cuda_check(cudaStreamSynchronize(stream_), "download sync");
  }

  void zero(Tensor& t) override {
    cuda_check(cudaMemsetAsync(t.data, 0, t.nbytes(), stream_), "zero");
  }

  void copy_to_device(const void* src, Tensor& dst) override {
    cuda_check(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_),
               "copy_to_device");
  }

  std::shared_ptr<void> host_staging(size_t bytes) override {
    void* p = nullptr;  // portable: pinned for every GPU's copies (parallel ranks)
    cuda_check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  }

  void download_async(const Tensor& src, void* dst) override {
    cuda_check(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_),
               "download_async");
  }

  std::unique_ptr<StreamMark> make_mark() override {
    return std::make_unique<cuda::CudaStreamMark>(stream_, profiler_);
  }

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    cuda::OpScope scope(profiler_, "embedding", stream_, capturing_);
    expect(table, DType::kBF16, "embedding table");
    kernels::cuda::embedding(
        {bf(table), ids.as<int32_t>(), bf_mut(out), int(ids.numel()), int(table.dim(1))}, stream_);
  }

  void rms_norm(const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                Tensor& out) override {
    cuda::OpScope scope(profiler_, "rms_norm", stream_, capturing_);
    expect(x, DType::kBF16, "rms_norm input");
    const int hidden = int(w.numel());
    kernels::cuda::rms_norm({bf(x), residual ? bf_mut(*residual) : nullptr, bf(w), bf_mut(out),
                             int(x.numel() / hidden), hidden, eps},
                            stream_);
  }

  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override {
    cuda::OpScope scope(profiler_, "linear", stream_, capturing_);
    expect(x, DType::kBF16, "linear input");
    expect(w, DType::kBF16, "linear weight");
    const int k = int(w.dim(1)), n = int(w.dim(0));
    const int m = int(x.numel() / k);
    if (m == 0) return;
    const int64_t weight_bytes = int64_t(n) * k * 2;
    const bool bf16_out = y.dtype == DType::kBF16 || y.dtype == DType::kF32;
    const bool bias_ok = !bias || bias->dtype == DType::kBF16;
    const kernels::cuda::Bf16GemvParams gemv{
        bf(x), bf(w), bias ? bf(*bias) : nullptr, y.data, y.dtype == DType::kF32, m, n, k};
    // One or two tokens on up to 64 MB of weights (every projection of the bench models, not
    // their LM heads): the bulk-copy GEMV with three CTAs per SM. H100, side by side: Qwen3-30B
    // bf16 b1 TPOT 3.20 vs 3.35 ms, b2 4.54 vs 4.60, Qwen3-0.6B b1 0.87 vs 0.98; the LM heads
    // gained nothing (bench/RESULTS.md). SERVAL_BF16_GEMV_BULK=0 turns it off, =1 or 2 sets the
    // CTAs per SM.
    if (bf16_bulk_ctas_per_sm_ > 0 && m <= 2 && weight_bytes <= (int64_t(64) << 20) && bf16_out &&
        bias_ok && kernels::cuda::bf16_gemv_bulk_supported(x.data, w.data, m, k)) {
      kernels::cuda::bf16_gemv_bulk(gemv, bf16_bulk_ctas_per_sm_, stream_);
      return;
    }
    // The register-streaming GEMV (shapes the bulk one does not take) where it beats cuBLASLt
    // (Bf16GemvBench.DISABLED_VsCublasLt on the H200, graph-timed over cold weights,
    // bench/RESULTS.md): one or two tokens on up to 8 MB of weights (up to 3× faster there); on
    // larger weights cuBLASLt is as fast or faster.
    const bool gemv_wins = m <= 2 && weight_bytes <= (int64_t(8) << 20);
    if (gemv_wins && bf16_out && bias_ok &&
        kernels::cuda::bf16_gemv_supported(x.data, w.data, m, k)) {
      kernels::cuda::bf16_gemv(gemv, stream_);
      return;
    }
    gemm().run(x.data, w.data, bias ? bias->data : nullptr, y.data, y.dtype, m, n, k, stream_);
  }

  void attention(const Tensor& qkv, const AttentionParams& a, KvCacheLayer& cache,
                 const StepMetadata& meta, Tensor& out) override {
    cuda::OpScope scope(profiler_, "attention", stream_, capturing_);
    expect(qkv, DType::kBF16, "attention input");
    const int T = meta.num_tokens;
    kernels::cuda::QkNormRopeKvParams r{};
    r.qkv = bf(qkv);
    r.q_norm = a.q_norm ? bf(*a.q_norm) : nullptr;
    r.k_norm = a.k_norm ? bf(*a.k_norm) : nullptr;
    r.positions = meta.positions.as<int32_t>();
    r.inv_freq = a.inv_freq->as<float>();
    r.slot_mapping = meta.slot_mapping.as<int32_t>();
    r.k_cache = cache.k.data;
    r.v_cache = cache.v.data;
    r.cache_dtype = cache.k.dtype;
    r.k_scale = cache.k_scale;
    r.v_scale = cache.v_scale;
    r.num_tokens = T;
    r.num_q_heads = a.num_q_heads;
    r.num_kv_heads = a.num_kv_heads;
    r.head_dim = a.head_dim;
    r.eps = a.rms_norm_eps;

    kernels::cuda::PagedAttentionParams p{};
    p.out = bf_mut(out);
    p.k_cache = cache.k.data;
    p.v_cache = cache.v.data;
    p.cache_dtype = cache.k.dtype;
    p.query_start = meta.query_start.as<int32_t>();
    p.context_lens = meta.context_lens.as<int32_t>();
    p.block_tables = meta.block_tables.as<int32_t>();
    p.num_tokens = T;
    p.num_seqs = meta.num_seqs;
    p.max_blocks_per_seq = meta.max_blocks_per_seq;
    p.block_size = cache.block_size;
    p.num_q_heads = a.num_q_heads;
    p.num_kv_heads = a.num_kv_heads;
    p.head_dim = a.head_dim;
    p.max_query_len = meta.max_query_len;
    p.max_context_len = meta.max_context_len;
    p.scale = a.scale * cache.k_scale;
    p.v_scale = cache.v_scale;
    const size_t ws = kernels::cuda::paged_attention_workspace_bytes(
        meta.num_seqs, a.num_q_heads, a.num_kv_heads, a.head_dim, meta.max_query_len,
        meta.max_context_len);
    Tensor workspace;
    if (ws > 0) {
      workspace = empty(DType::kU8, {int64_t(ws)});
      p.workspace = workspace.data;
      p.workspace_bytes = ws;
    }
    // Decode steps: the q/k norm, RoPE and KV append inside the decode attention kernel.
    if (meta.max_query_len == 1 && rope_in_attention_) {
      kernels::cuda::paged_attention_rope(p, r, stream_);
      return;
    }
    Tensor q = empty(DType::kBF16, {T, a.num_q_heads, a.head_dim});
    r.q_out = bf_mut(q);
    p.q = bf(q);
    kernels::cuda::qk_norm_rope_kv(r, stream_);
    kernels::cuda::paged_attention(p, stream_);
  }

  // Single linears (experts == 0) are repacked on the host into the quant_gemm fragment layout
  // (quantized_pack.h; gate/up weights with their rows tiled), then copied. Expert stacks
  // (experts > 0) are copied unchanged, checkpoint layout, for the MoE kernels.
  QuantizedWeight upload_quantized(const QuantizedWeight& host) override {
    QuantizedWeight dev = host;
    set_activation_scale(dev);
    if (host.experts > 0) {
      dev.data = upload(host.data);
      if (host.scales.data) dev.scales = upload(host.scales);
      return dev;
    }
    const cuda::PackedLinear packed = cuda::pack_quantized_linear(host);
    const int n = host.n, k = host.k;
    dev.rows_reordered = packed.rows_reordered;
    dev.data =
        upload(host_view(packed.data.data(), DType::kU8, {int64_t(packed.data.size())}, nullptr));
    switch (host.format) {
      case kernels::WeightFormat::kNvfp4:
        dev.scales = upload(
            host_view(packed.nvfp4_scales.data(), DType::kF8E4M3,
                      {kernels::cuda::quant_gemm_n_pad(n), kernels::cuda::quant_gemm_k_pad(k) / 16},
                      nullptr));
        break;
      case kernels::WeightFormat::kFp8Block:
        dev.scales =
            upload(host_view(packed.block_scales.data(), DType::kBF16, host.scales.shape, nullptr));
        break;
      case kernels::WeightFormat::kFp8PerChannel:
        dev.scales = upload(host_view(packed.channel_scales.data(), DType::kF32, {n}, nullptr));
        break;
      case kernels::WeightFormat::kFp8PerTensor:
        break;
    }
    return dev;
  }

  bool generates_dummy_weights() const override { return true; }

  // One dummy_dense launch per block, straight into the bf16 weight.
  Tensor dummy_dense(const DummyDense& d) override {
    int64_t numel = 1, rows = 0;
    for (int64_t s : d.shape) numel *= s;
    for (const DummyBlock& b : d.blocks) rows += b.rows;
    if (d.cols <= 0 || rows * d.cols != numel)
      throw InvalidArgument("cuda backend: dummy_dense blocks of " + std::to_string(rows) +
                            " rows × " + std::to_string(d.cols) + " columns do not cover " +
                            shape_str(d.shape));
    Tensor t = empty(DType::kBF16, d.shape);
    int64_t row = 0;
    for (const DummyBlock& b : d.blocks) {
      kernels::cuda::dummy_dense({bf_mut(t) + row * d.cols, b.rows, d.cols, b.key, b.offset,
                                  b.row_stride, b.center, b.half_width, d.dtype},
                                 stream_);
      row += b.rows;
    }
    return t;
  }

  // The layouts upload_quantized makes, generated in place: expert stacks (NVFP4) in checkpoint
  // layout, single linears in the quant_gemm fragment layout with its padding zero (a mask
  // packed from an all-ones checkpoint weight when the shape is padded). FP8 expert stacks take
  // the host path (then prepare_moe repacks them).
  QuantizedWeight dummy_quantized(const DummyQuantized& d) override {
    const QuantizedWeight& m = d.meta;
    const bool nvfp4 = m.format == kernels::WeightFormat::kNvfp4;
    if (m.experts > 0 && !nvfp4) return Backend::dummy_quantized(d);
    const size_t copies = size_t(m.experts > 0 ? m.experts : 1);
    if (m.global_scale.size() != copies || m.input_scale.size() != copies)
      throw InvalidArgument(
          "cuda backend: dummy_quantized needs one global and input scale per "
          "expert");
    QuantizedWeight dev = m;
    set_activation_scale(dev);
    const int64_t n = m.n, k = m.k;
    if (m.experts > 0) {
      if (n <= 0 || k <= 0 || k % 16 != 0)
        throw InvalidArgument("cuda backend: NVFP4 expert stack [" + std::to_string(n) + ", " +
                              std::to_string(k) + "] needs k % 16 == 0");
      const int64_t rows = m.experts * n;
      dev.data = empty(DType::kU8, {m.experts, n, k / 2});
      kernels::cuda::dummy_bytes(
          {dev.data.as<uint8_t>(), nullptr, rows * (k / 2), d.data_key, false, 0.0f}, stream_);
      dev.scales = empty(DType::kF8E4M3, {m.experts, n, k / 16});
      kernels::cuda::dummy_codes({static_cast<uint8_t*>(dev.scales.data), rows, k / 16, rows,
                                  k / 16, d.scale_key, d.sf_code_lo, d.sf_code_hi},
                                 stream_);
      return dev;
    }
    cuda::check_quantized_linear_shape(m);
    // Random rows in any order are random rows: a gate/up weight is simply marked tiled.
    dev.rows_reordered = cuda::tiles_gate_up(m);
    const int64_t bytes = int64_t(kernels::cuda::quant_gemm_data_bytes(m.format, m.n, m.k));
    const int64_t src_bytes = nvfp4 ? n * k / 2 : n * k;
    dev.data = empty(DType::kU8, {bytes});
    kernels::cuda::dummy_bytes(
        {dev.data.as<uint8_t>(),
         bytes == src_bytes ? nullptr : packing_mask(m.format, m.n, m.k).as<const uint8_t>(), bytes,
         d.data_key, !nvfp4, d.fp8_half_width},
        stream_);
    switch (m.format) {
      case kernels::WeightFormat::kNvfp4: {
        const int64_t n_pad = kernels::cuda::quant_gemm_n_pad(m.n);
        const int64_t cols_pad = kernels::cuda::quant_gemm_k_pad(m.k) / 16;
        dev.scales = empty(DType::kF8E4M3, {n_pad, cols_pad});  // tiled (quant_gemm.h)
        kernels::cuda::dummy_codes({static_cast<uint8_t*>(dev.scales.data), n, k / 16, n_pad,
                                    cols_pad, d.scale_key, d.sf_code_lo, d.sf_code_hi, true},
                                   stream_);
        break;
      }
      case kernels::WeightFormat::kFp8Block: {  // a few KB: packed on the host
        const Shape shape{ceil_div<int64_t>(n, m.block_n), ceil_div<int64_t>(k, m.block_k)};
        const std::vector<float> s(size_t(shape[0] * shape[1]), d.fp8_scale);
        const std::vector<bf16> packed =
            kernels::cuda::quant_gemm_pack_block_scales(s.data(), s.size());
        dev.scales = upload(host_view(packed.data(), DType::kBF16, shape, nullptr));
        break;
      }
      case kernels::WeightFormat::kFp8PerChannel: {
        const std::vector<float> s(size_t(n), d.fp8_scale);
        dev.scales = upload(host_view(s.data(), DType::kF32, {n}, nullptr));
        break;
      }
      case kernels::WeightFormat::kFp8PerTensor:
        break;
    }
    return dev;
  }

  // Up to kQuantGemmMaxM rows: the fused dequant GEMM (one pass over the weights for all rows);
  // beyond: dequantize the weight into a bf16 step temporary [n, k] (16-byte stores) and run the
  // dense cuBLASLt GEMM. The crossover (64) is to be confirmed with QuantGemmBench on the H200.
  void quantized_linear(const Tensor& x, const QuantizedWeight& w, const Tensor* bias,
                        Tensor& y) override {
    cuda::OpScope scope(profiler_, "quantized_linear", stream_, capturing_);
    if (w.rows_reordered)
      throw InvalidArgument(
          "cuda backend: a gate/up weight with tiled rows runs through linear_silu_mul only");
    run_quantized_linear(x, w, bias, y, false);
  }

  // Quantized gate/up weights with tiled rows: up to kQuantGemvMaxM tokens the decode GEMV
  // writes silu(gate) · up itself; more tokens get the tiled [T, 2I] product, then silu_mul with
  // the tiled layout.
  void linear_silu_mul(const Tensor& x, const Weight& gate_up, Tensor& out) override {
    if (!gate_up.q || !gate_up.q->rows_reordered) {
      Backend::linear_silu_mul(x, gate_up, out);
      return;
    }
    cuda::OpScope scope(profiler_, "linear_silu_mul", stream_, capturing_);
    const QuantizedWeight& w = *gate_up.q;
    expect(out, DType::kBF16, "linear_silu_mul output");
    const int64_t m = x.numel() / w.k;
    if (out.numel() != m * (w.n / 2))
      throw InvalidArgument("cuda backend: linear_silu_mul output " + shape_str(out.shape) +
                            " is not [" + std::to_string(m) + ", " + std::to_string(w.n / 2) + "]");
    if (m <= kernels::cuda::kQuantGemvMaxM) {
      run_quantized_linear(x, w, nullptr, out, true);
      return;
    }
    Tensor h = empty(DType::kBF16, {m, int64_t(w.n)});
    run_quantized_linear(x, w, nullptr, h, false);
    kernels::cuda::silu_mul({bf(h), bf_mut(out), int(m), w.n / 2, 16}, stream_);
  }

  void silu_mul(const Tensor& x, Tensor& out) override {
    cuda::OpScope scope(profiler_, "silu_mul", stream_, capturing_);
    const int inter = int(out.dim(-1));
    kernels::cuda::silu_mul({bf(x), bf_mut(out), int(out.numel() / inter), inter}, stream_);
  }

  void to_float(const Tensor& x, Tensor& out) override {
    cuda::OpScope scope(profiler_, "to_float", stream_, capturing_);
    kernels::cuda::bf16_to_float({bf(x), static_cast<float*>(out.data), x.numel()}, stream_);
  }

  void sigmoid_gate_add(const Tensor& gate, const Tensor& x, Tensor& out) override {
    cuda::OpScope scope(profiler_, "sigmoid_gate_add", stream_, capturing_);
    const int cols = int(out.dim(-1));
    kernels::cuda::sigmoid_gate_add({bf(gate), bf(x), bf_mut(out), int(out.numel() / cols), cols},
                                    stream_);
  }

  void mla_attention(const Tensor& q, const Tensor& q_lat, const Tensor& kv, const MlaParams& a,
                     KvCacheLayer& cache, const StepMetadata& meta, Tensor& out) override {
    cuda::OpScope scope(profiler_, "mla_attention", stream_, capturing_);
    cuda::run_mla_attention(*this, q, q_lat, kv, a, cache, meta, out, stream_);
  }

  void head_linear(const Tensor& x, int x_stride, const Tensor& w, Tensor& y) override {
    cuda::OpScope scope(profiler_, "head_linear", stream_, capturing_);
    expect(x, DType::kBF16, "head_linear input");
    expect(w, DType::kBF16, "head_linear weight");
    expect(y, DType::kBF16, "head_linear output");
    if (w.shape.size() != 3)
      throw InvalidArgument("cuda backend: head_linear weight " + shape_str(w.shape) +
                            " is not [H, n, k]");
    const int64_t T = x.dim(0), H = w.dim(0), n = w.dim(1), k = w.dim(2);
    if (x_stride < k || x.numel() != T * H * x_stride || y.numel() != T * H * n)
      throw InvalidArgument("cuda backend: head_linear x " + shape_str(x.shape) + ", y " +
                            shape_str(y.shape) + " for w " + shape_str(w.shape) + " and x_stride " +
                            std::to_string(x_stride) +
                            ": expected x [T, H·x_stride] with x_stride ≥ k, y [T, H·n]");
    kernels::cuda::head_linear({bf(x), bf(w), bf_mut(y), int(T), int(H), int(n), int(k), x_stride},
                               stream_);
  }

  void add(const Tensor& x, Tensor& out) override {
    cuda::OpScope scope(profiler_, "add", stream_, capturing_);
    expect(x, DType::kBF16, "add input");
    expect(out, DType::kBF16, "add output");
    if (x.numel() != out.numel())
      throw InvalidArgument("cuda backend: add of " + shape_str(x.shape) + " to " +
                            shape_str(out.shape) + ": the element counts differ");
    kernels::cuda::add({bf(x), bf_mut(out), out.numel()}, stream_);
  }

  // The expert kernels need hidden % 128 == 0 and inter % 64 == 0: other shapes (the tiny test
  // models) get zero-padded weights, which leave every real output unchanged. NVFP4 and FP8
  // experts are repacked into the GEMMs' fragment order (moe_cuda.h, prepare_nvfp4_experts /
  // prepare_fp8_experts), padded with code 0 (and zero scales).
  void prepare_moe(MoeWeights& w) override {
    const int E = w.num_experts, H = w.hidden, I = w.inter;
    w.padded_hidden = int(round_up<int64_t>(H, 128));
    w.padded_inter = int(round_up<int64_t>(I, 64));
    if (w.gate_up_q || w.down_q) {
      // Quantized experts: NVFP4 and FP8 are repacked (and zero-padded) for the expert GEMMs.
      const std::string what = "MoE experts (" + std::to_string(E) + " experts, hidden " +
                               std::to_string(H) + ", inter " + std::to_string(I) + ")";
      if (!w.gate_up_q || !w.down_q || w.gate_up_q->format != w.down_q->format)
        throw InvalidArgument("cuda backend: " + what +
                              " need gate_up and down quantized in one format");
      for (const QuantizedWeight* q : {&*w.gate_up_q, &*w.down_q})
        if (q->experts != w.num_local)
          throw InvalidArgument("cuda backend: " + what + " hold " + std::to_string(q->experts) +
                                " quantized experts, expected the " + std::to_string(w.num_local) +
                                " local ones");
      const bool fp8 = moe::is_fp8_experts(*w.gate_up_q);
      const auto prepare = fp8 ? moe::prepare_fp8_experts : moe::prepare_nvfp4_experts;
      prepare(*w.gate_up_q, true, 2 * w.padded_inter, w.padded_hidden, *this, stream_,
              "gate_up of " + what);
      prepare(*w.down_q, false, w.padded_hidden, w.padded_inter, *this, stream_, "down of " + what);
      return;
    }
    cuda::pad_bf16_experts(*this, w, stream_);
  }

  void moe(const Tensor& x, const MoeWeights& w, Tensor& out) override { run_moe(x, w, out, {}); }

  // A few tokens on the latency experts: one kernel for the residual add, the norm, the router
  // GEMV and the routing (kernels/cuda/moe/moe_norm_router.h), then the expert stages with the
  // routing done. Everything else (and SERVAL_NO_FUSED_MOE_NORM=1): rms_norm, then the block.
  // Either way the next add + norm goes into the block's finalize where it ends with one.
  bool add_rms_norm_moe(const Tensor& delta, Tensor& residual, const Tensor& norm_w, float eps,
                        Tensor& x, const MoeWeights& w, Tensor& out,
                        const Tensor* next_norm) override {
    const NextNorm next{next_norm, &residual, &x, eps};
    namespace kc = kernels::cuda;
    const int T = int(delta.dim(0)), H = w.hidden, E = w.num_experts;
    kc::MoeNormRouterParams p{};
    p.h = bf(delta);
    p.residual = bf_mut(residual);
    p.norm_weight = bf(norm_w);
    p.router = bf(w.router);
    p.x = bf_mut(x);
    p.hidden = H;
    p.eps = eps;
    p.routing.num_tokens = T;
    p.routing.num_experts = E;
    p.routing.top_k = w.top_k;
    p.routing.method = w.routing;
    p.routing.renormalize = w.renormalize;
    p.routing.correction_bias = w.correction_bias.data ? w.correction_bias.as<float>() : nullptr;
    p.routing.num_groups = w.num_groups;
    p.routing.topk_groups = w.topk_groups;
    p.routing.routed_scaling_factor = w.routed_scaling_factor;
    p.routing.local_offset = w.local_offset;
    p.routing.num_local = w.num_local;
    auto is_bf16 = [](const Tensor& t) { return t.dtype == DType::kBF16; };
    // Fused up to kMoeNormRouterMaxTokens (8): one CTA per (token, router rows) measured faster
    // than the unfused kernels at every size on the H200 (Qwen3-30B NVFP4, fp8 KV, 1024 context:
    // b8 TPOT 4.76-4.81 vs 5.01 ms, b5 4.06-4.11 vs 4.34-4.38).
    const bool fuse = fuse_moe_norm_ && T <= kc::kMoeNormRouterMaxTokens &&
                      w.expert_backend == "latency" && is_bf16(delta) && is_bf16(residual) &&
                      is_bf16(x) && is_bf16(norm_w) && is_bf16(w.router) && delta.dim(-1) == H &&
                      residual.numel() == delta.numel() && x.numel() == delta.numel() &&
                      norm_w.numel() == H && w.router.numel() == int64_t(E) * H &&
                      kc::moe_norm_router_supported(p);
    if (!fuse) {
      rms_norm(delta, &residual, norm_w, eps, x);
      return run_moe(x, w, out, next);
    }
    cuda::OpScope scope(profiler_, "add_rms_norm_moe", stream_, capturing_);
    Tensor router_logits = empty(DType::kF32, {T, E});
    cuda::MoeCall c = cuda::make_moe_call(*this, x, w, out, router_logits);
    const moe::MoeWorkspaceView ws = moe::moe_workspace_view(c.args);
    p.logits = router_logits.as<float>();
    p.routing.tile = ws.tile;
    p.routing.topk_ids = ws.topk_ids;
    p.routing.topk_weights = ws.topk_weights;
    p.routing.expanded_to_permuted = ws.expanded_to_permuted;
    p.routing.permuted_to_token = ws.permuted_to_token;
    p.routing.tile_expert = ws.tile_expert;
    p.routing.num_tiles = ws.num_tiles;
    // Up to SERVAL_MOE_ROUTE_IN_GEMV tokens (default 1) on the NVFP4 expert GEMVs: this kernel
    // ends after the logits and the residual, and every GEMV CTA routes its token itself (no
    // routing tail of one CTA on the critical path). Qwen3-30B NVFP4 on the H200: batch-1 TPOT
    // 2.235-2.238 ms vs 2.276-2.297 (norm+router 4.5 instead of 7.7 us per layer, gate_up 12.7
    // instead of 10.3); 2 tokens 2.784-2.808 vs 2.681-2.683, hence the default of 1.
    const bool route_in_gemv = T <= moe_route_in_gemv_tokens_ && moe::moe_runs_gemv(c.args);
    p.logits_only = route_in_gemv;
    kc::moe_norm_router_topk(p, stream_);
    kc::timeline_mark("moe norm+router", stream_);
    cuda::pad_moe_input(x, c, stream_);
    c.args.routed = !route_in_gemv;
    c.args.route_in_gemv = route_in_gemv;
    set_next_norm(c, out, next);
    if (moe::moe_forward_cuda(c.args, stream_)) return true;
    cuda::unpad_moe_output(c, out, stream_);
    return false;
  }

  void argmax(const Tensor& logits, Tensor& out) override {
    cuda::OpScope scope(profiler_, "argmax", stream_, capturing_);
    expect(logits, DType::kF32, "argmax logits");
    kernels::cuda::argmax(
        {logits.as<float>(), out.as<int32_t>(), int(logits.dim(0)), int(logits.dim(1))}, stream_);
  }

  void resolve_pending_tokens(Tensor& ids, const Tensor& sampled) override {
    cuda::OpScope scope(profiler_, "resolve_pending_tokens", stream_, capturing_);
    expect(ids, DType::kI32, "pending token ids");
    expect(sampled, DType::kI32, "sampled token ids");
    kernels::cuda::resolve_pending_tokens(
        {ids.as<int32_t>(), sampled.as<int32_t>(), int(ids.numel())}, stream_);
  }

  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override {
    cuda::OpScope scope(profiler_, "gather_rows", stream_, capturing_);
    expect(x, DType::kBF16, "gather_rows input");
    kernels::cuda::gather_rows(
        {bf(x), rows.as<int32_t>(), bf_mut(out), int(rows.numel()), int(x.numel() / x.dim(0))},
        stream_);
  }

 private:
  // The add + RMSNorm after an MoE block (Backend::add_rms_norm_moe's next_norm): the norm weight
  // (null: none), the residual it adds the block's output to, its output x, and eps.
  struct NextNorm {
    const Tensor* weight;
    Tensor* residual;
    Tensor* x;
    float eps;
  };

  // The router GEMM and the expert stages on x; with next.weight set, the add + norm after the
  // block fused into its finalize where it can (returns true: x then holds the next block's
  // input and out is not written).
  bool run_moe(const Tensor& x, const MoeWeights& w, Tensor& out, const NextNorm& next) {
    cuda::OpScope scope(profiler_, "moe", stream_, capturing_);
    expect(x, DType::kBF16, "moe input");
    const int T = int(x.dim(0));
    Tensor router_logits = empty(DType::kF32, {T, w.num_experts});
    linear(x, w.router, nullptr, router_logits);
    cuda::MoeCall c = cuda::make_moe_call(*this, x, w, out, router_logits);
    cuda::pad_moe_input(x, c, stream_);
    set_next_norm(c, out, next);
    if (moe::moe_forward_cuda(c.args, stream_)) return true;
    cuda::unpad_moe_output(c, out, stream_);
    return false;
  }

  // Points c's finalize at the next add + norm (residual += out, x = rms_norm(residual) ·
  // next.weight), unless SERVAL_NO_FUSED_MOE_FINALIZE_NORM=1, the output is padded or the shapes
  // or dtypes do not fit the fused kernel. x (the experts' input) is free again by the finalize.
  void set_next_norm(cuda::MoeCall& c, const Tensor& out, const NextNorm& next) const {
    if (!fuse_moe_finalize_norm_ || next.weight == nullptr || c.outp.data != nullptr) return;
    const Tensor& nw = *next.weight;
    Tensor &residual = *next.residual, &x = *next.x;
    const int64_t H = out.dim(-1);
    auto fits = [&](const Tensor& t, int64_t numel) {
      return t.dtype == DType::kBF16 && t.numel() == numel &&
             reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
    };
    if (H > kernels::cuda::kMoeFinalizeNormMaxHidden || H != c.args.hidden ||
        !fits(out, out.numel()) || !fits(residual, out.numel()) || !fits(x, out.numel()) ||
        !fits(nw, H))
      return;
    c.args.next_norm = {bf_mut(residual), bf(nw), bf_mut(x), next.eps};
  }

  // y = x · dequant(w)ᵀ (+ bias); with swiglu (m ≤ kQuantGemvMaxM, tiled gate/up rows) y [m, n/2]
  // = silu(gate) · up from the decode GEMV's epilogue.
  void run_quantized_linear(const Tensor& x, const QuantizedWeight& w, const Tensor* bias,
                            Tensor& y, bool swiglu) {
    expect(x, DType::kBF16, "quantized_linear input");
    if (w.experts != 0)
      throw InvalidArgument("cuda backend: quantized_linear takes a single linear, not experts");
    if (bias) expect(*bias, DType::kBF16, "quantized_linear bias");
    if (y.dtype != DType::kBF16 && y.dtype != DType::kF32)
      throw InvalidArgument("cuda backend: quantized_linear output must be bf16 or f32");
    const int m = int(x.numel() / w.k);
    if (m == 0) return;
    // W4A4 emulation: the input rounded through NVFP4 (SPEC 2.2 recipe), then the W4A16 GEMM.
    Tensor xq;
    const Tensor* input = &x;
    if (w.quantize_activations) {
      Tensor codes = empty(DType::kU8, {int64_t(m) * w.k / 2});
      Tensor sf = empty(DType::kU8, {int64_t(m) * w.k / 16});
      xq = empty(DType::kBF16, {int64_t(m), int64_t(w.k)});
      const float* g = w.activation_scale.as<float>();
      kernels::cuda::nvfp4_quant(
          {x.data, DType::kBF16, g, static_cast<uint8_t*>(codes.data),
           static_cast<uint8_t*>(sf.data), kernels::Nvfp4SfLayout::kLinear, m, w.k},
          stream_);
      kernels::cuda::nvfp4_dequant({static_cast<const uint8_t*>(codes.data),
                                    static_cast<const uint8_t*>(sf.data), g, bf_mut(xq), m, w.k},
                                   stream_);
      input = &xq;
    }
    const kernels::cuda::QuantGemmWeight qw = cuda::quant_gemm_weight(w);
    if (m > kernels::cuda::kQuantGemmMaxM) {
      Tensor dense = empty(DType::kBF16, {w.n, w.k});
      kernels::cuda::quant_dequant_bf16(qw, bf_mut(dense), stream_);
      gemm().run(input->data, dense.data, bias ? bias->data : nullptr, y.data, y.dtype, m, w.n, w.k,
                 stream_);
      return;
    }
    kernels::cuda::QuantGemmParams p{};
    p.x = bf(*input);
    p.w = qw;
    p.bias = bias ? bf(*bias) : nullptr;
    p.y = y.data;
    p.y_f32 = y.dtype == DType::kF32;
    p.m = m;
    p.swiglu = swiglu;
    p.workspace_bytes = kernels::cuda::quant_gemm_workspace_bytes(m, w.n, w.k);
    Tensor workspace;
    if (p.workspace_bytes > 0) {
      workspace = empty(DType::kU8, {int64_t(p.workspace_bytes)});
      p.workspace = workspace.data;
    }
    kernels::cuda::quant_gemm(p, stream_);
  }

  // W4A4: the device copy of 1/input_scale the activation quantizer reads, one per expert of a
  // stack (the MoE expert GEMMs' row quantizer, moe_cuda.h).
  void set_activation_scale(QuantizedWeight& dev) {
    if (!dev.quantize_activations) return;
    const size_t copies = size_t(dev.experts > 0 ? dev.experts : 1);
    if (dev.input_scale.size() != copies)
      throw InvalidArgument("cuda backend: W4A4 needs one input scale per expert (" +
                            std::to_string(dev.input_scale.size()) + " for " +
                            std::to_string(copies) + ")");
    std::vector<float> g(copies);
    for (size_t e = 0; e < copies; ++e) g[e] = 1.0f / dev.input_scale[e];
    dev.activation_scale = upload(host_view(g.data(), DType::kF32, {int64_t(copies)}, nullptr));
  }

  // The fragment layout (quant_gemm.h) of an all-ones [n, k] weight: 0xF nibbles (FP8: 0xFF
  // bytes) where real codes go, zero in the padding. One per shape, kept for the backend's life.
  const Tensor& packing_mask(kernels::WeightFormat format, int n, int k) {
    Tensor& mask = packing_masks_[{int(format), n, k}];
    if (!mask.data) {
      const bool nvfp4 = format == kernels::WeightFormat::kNvfp4;
      const std::vector<uint8_t> ones(nvfp4 ? size_t(n) * k / 2 : size_t(n) * k, 0xFF);
      const std::vector<uint8_t> packed =
          kernels::cuda::quant_gemm_pack_data(format, ones.data(), n, k);
      mask = upload(host_view(packed.data(), DType::kU8, {int64_t(packed.size())}, nullptr));
    }
    return mask;
  }

  cuda::CublasLtGemm& gemm() {
    if (!gemm_) gemm_ = std::make_unique<cuda::CublasLtGemm>();
    return *gemm_;
  }

  cudaStream_t stream_ = nullptr;
  int device_ = 0;  // the CUDA device current when the backend was created
  std::unique_ptr<cuda::CublasLtGemm> gemm_;
  cuda::PinnedUploader uploader_;  // weight uploads (staging allocated on first use)
  cuda::OpTimeline timeline_;      // SERVAL_OP_TIMELINE=1
  cuda::OpProfiler profiler_;      // SERVAL_PROFILE_OPS=1
  Tensor arena_;                   // step memory, see reserve_step_memory
  size_t arena_offset_ = 0;
  bool in_step_ = false, capturing_ = false, warned_arena_ = false;
  // Fused residual add + norm + router + routing before the MoE experts (add_rms_norm_moe);
  // SERVAL_NO_FUSED_MOE_NORM=1 turns it off (for side-by-side timing).
  const bool fuse_moe_norm_ = std::getenv("SERVAL_NO_FUSED_MOE_NORM") == nullptr;
  // Decode attention applies RoPE and appends the new key and value itself (paged_attention_rope);
  // SERVAL_NO_ROPE_IN_ATTENTION=1 runs qk_norm_rope_kv before it instead (for comparisons).
  const bool rope_in_attention_ = std::getenv("SERVAL_NO_ROPE_IN_ATTENTION") == nullptr;
  // SERVAL_NO_FUSED_MOE_FINALIZE_NORM=1: the add + RMSNorm after an MoE block as its own rms_norm
  // kernel instead of inside the block's finalize (A/B and bisection).
  const bool fuse_moe_finalize_norm_ = std::getenv("SERVAL_NO_FUSED_MOE_FINALIZE_NORM") == nullptr;
  // SERVAL_MOE_ROUTE_IN_GEMV=N: MoE steps of at most N tokens route inside the NVFP4 expert GEMVs
  // (add_rms_norm_moe); 0 turns it off.
  const int moe_route_in_gemv_tokens_ = env_int("SERVAL_MOE_ROUTE_IN_GEMV", 0, 1 << 20, 1);
  // CTAs per SM of the bulk-copy bf16 GEMV (linear); 0 turns it off.
  const int bf16_bulk_ctas_per_sm_ = env_int("SERVAL_BF16_GEMV_BULK", 0, 3, 3);
  std::map<std::tuple<int, int, int>, Tensor> packing_masks_;  // see packing_mask
};

}  // namespace

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::unique_ptr<Backend> make_cuda_backend() {
  if (!cuda_available()) return nullptr;
  return std::make_unique<CudaBackend>();
}

}  // namespace serval::backend
