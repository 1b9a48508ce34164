// ModelRunner: turns scheduled chunks into one forward pass over the paged KV cache.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/decode_graphs.h"
#include "runtime/staging_ring.h"

namespace serval::runtime {

// One sequence's slice of a step: tokens [start, start + num_new) of `tokens`, whose KV lives in
// the blocks of `block_table`.
struct SeqChunk {
  std::span<const int32_t> tokens;
  int start = 0;
  int num_new = 0;
  std::span<const int32_t> block_table;
  // Logits wanted: none, the last new token's, or every new token's (golden tests, echo).
  enum class Logits { kNone, kLast, kAll } logits = Logits::kLast;
};

// Host-side metadata of a step (built once, uploaded once).
backend::StepMetadata build_step_metadata(std::span<const SeqChunk> chunks, int block_size);

// Step execution options; the defaults (no graphs, no arena) suit tests and the CPU.
struct RunnerOptions {
  int max_model_len = 0;                  // > 0 enables the fixed decode layout (and graphs, below)
  int max_decode_batch = 0;               // largest decode batch captured in a CUDA graph
  bool cuda_graphs = false;               // capture pure-decode steps (FULL_DECODE_ONLY)
  bool defer_graph_capture = false;       // the owner calls capture_decode_graphs() itself
  int64_t step_memory_bytes = 0;          // activation arena (see Backend::reserve_step_memory)
  std::optional<DType> kv_cache_dtype;    // unset: the backend's default
  std::vector<float> k_scales, v_scales;  // per layer (fp8 KV); empty: 1.0
  // > 0: greedy steps of up to this many logits rows keep their ids on the device, where the
  // next step's pending tokens (StepRunner::launch_greedy) take them (async scheduling).
  int token_feedback_rows = 0;
};

// What the engine drives: one step over scheduled chunks. ModelRunner runs one model on one
// backend; ParallelRunner (parallel_runner.h) runs tensor/expert-parallel ranks together.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Runs one step; returns logits [rows, vocab] in host memory, rows in chunk order.
  virtual std::vector<float> execute(std::span<const SeqChunk> chunks) = 0;
  // Runs one step and returns the argmax token of each logits row.
  virtual std::vector<int32_t> execute_greedy(std::span<const SeqChunk> chunks) = 0;

  // Greedy steps that overlap the host's work (async scheduling), where
  // supports_token_feedback(). launch_greedy queues a greedy step and returns without waiting
  // for the device; collect_greedy waits for the oldest queued step and returns its argmax ids
  // (execute_greedy's result). At most two steps are queued. A queued step's chunks may hold
  // pending tokens: −(r + 1) stands for row r of the ids that the greedy step launched just
  // before it sampled, taken on the device whether or not that step was collected.
  virtual bool supports_token_feedback() const { return false; }
  virtual void launch_greedy(std::span<const SeqChunk> chunks);
  virtual std::vector<int32_t> collect_greedy();
  virtual int block_size() const = 0;
  // The model and KV cache of rank 0 (the only one without parallelism).
  virtual model::Model& model() = 0;
  virtual const std::vector<backend::KvCacheLayer>& kv_cache() const = 0;
  // False once the runner cannot take steps any more (a multi-node peer was lost).
  virtual bool healthy() const { return true; }
};

class ModelRunner final : public StepRunner {
 public:
  // num_blocks KV blocks of block_size tokens for every layer of the model.
  ModelRunner(std::unique_ptr<backend::Backend> backend, std::unique_ptr<model::Model> model,
              int num_blocks, int block_size, const RunnerOptions& options = {});
  ~ModelRunner();
  // Runs one step; returns logits [rows, vocab] in host memory, rows in chunk order.
  // InvalidArgument when the chunks hold no new token.
  std::vector<float> execute(std::span<const SeqChunk> chunks) override;
  // Runs one step and returns the argmax token of each logits row (only ids leave the device).
  std::vector<int32_t> execute_greedy(std::span<const SeqChunk> chunks) override;
  bool supports_token_feedback() const override { return options_.token_feedback_rows > 0; }
  // InvalidArgument for a pending token without feedback or past the previous step's rows, and
  // when two steps are queued already.
  void launch_greedy(std::span<const SeqChunk> chunks) override;
  std::vector<int32_t> collect_greedy() override;
  // Data parallel + expert parallel (dp_ep_group.h): the next steps' tokens are rows
  // [offset, offset + tokens) of the `total` rows all replicas' MoE layers run on.
  void set_dp_rows(int offset, int total) {
    dp_row_offset_ = offset;
    dp_rows_total_ = total;
  }
  model::Model& model() override { return *model_; }
  backend::Backend& backend() { return *backend_; }
  int block_size() const override { return block_size_; }
  const std::vector<backend::KvCacheLayer>& kv_cache() const override { return kv_; }

  // Bytes of KV cache one token needs across all layers.
  static int64_t kv_bytes_per_token(const model::KvGeometry& g, DType kv_dtype);
  // Decode batch sizes that run as CUDA graphs (0 when graphs are off).
  int num_decode_graphs() const;
  // The pure-decode CUDA graphs (options.cuda_graphs with max_model_len and max_decode_batch
  // set; otherwise both are no-ops): warm_up_decode_graphs runs every bucket's step once and waits
  // for it, capture_decode_graphs then captures them. The constructor calls both unless
  // `defer_graph_capture`: the ranks of a parallel group call them together (ParallelRunner),
  // since their steps run collectives.
  void warm_up_decode_graphs();
  void capture_decode_graphs();
  // The batch buckets with a captured graph, and dropping all but `buckets` (DecodeGraphs).
  std::vector<int> decode_graph_buckets() const;
  void keep_decode_graph_buckets(const std::vector<int>& buckets);

 private:
  Tensor forward(std::span<const SeqChunk> chunks);
  // The model on `meta` after the pending tokens are resolved (with token feedback).
  Tensor run_model(const backend::StepMetadata& meta);
  // Throws unless every pending token of `chunks` names a row of sampled_ids_.
  void check_pending_tokens(std::span<const SeqChunk> chunks) const;
  // The decode graphs, made on first use; null when graphs are off.
  DecodeGraphs* decode_graphs();

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  std::vector<backend::KvCacheLayer> kv_;
  int block_size_;
  RunnerOptions options_;
  std::unique_ptr<DecodeGraphs> graphs_;
  std::unique_ptr<StagingRing> staging_;  // eager steps' metadata on its way to the device
  bool graphs_captured_ = false;
  int dp_row_offset_ = 0, dp_rows_total_ = 0;  // see set_dp_rows

  // Token feedback: the last greedy step's ids (persistent, so graphs read a fixed address),
  // of which the first sampled_rows_ may be named by the next step's pending tokens.
  Tensor sampled_ids_;
  int sampled_rows_ = 0;
  // Queued greedy steps: slots_[oldest_] and, when two are queued, the other one.
  struct QueuedIds {
    std::shared_ptr<void> host;  // host_staging: the ids' copy lands here
    int64_t capacity = 0;        // ids the host buffer holds
    std::unique_ptr<backend::StreamMark> done;
    int64_t rows = 0;
  };
  QueuedIds slots_[2];
  int oldest_ = 0, queued_ = 0;
};

}  // namespace serval::runtime
