// CUDA graphs of pure-decode steps: one graph per batch bucket, captured at start-up over
// static metadata buffers, replayed when every scheduled sequence decodes one token.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "runtime/staging_ring.h"

namespace serval::runtime {

struct SeqChunk;

// Batch sizes captured: 1, 2, 4, then multiples of 8 up to 256, then of 16, up to max_batch.
std::vector<int> decode_graph_buckets(int max_batch);

class DecodeGraphs {
 public:
  // `forward` runs the model on a StepMetadata and returns logits [rows, vocab] f32.
  using Forward = std::function<Tensor(const backend::StepMetadata&)>;

  // Static metadata sized for max_batch sequences of up to max_model_len tokens.
  DecodeGraphs(backend::Backend& b, int max_batch, int max_model_len, int block_size);

  // Runs every bucket's step once, eagerly, and waits for them: lazy kernel loads and GEMM plans
  // happen here, before any capture.
  void warm_up(const Forward& forward);
  // Captures every bucket (after warm_up); buckets whose capture fails stay eager.
  void capture_all(const Forward& forward);

  // True when `chunks` is a pure decode step that a captured graph can run.
  bool can_run(std::span<const SeqChunk> chunks) const;
  // Replays the bucket graph for `chunks` (padded); returns logits rows [0, chunks.size()).
  Tensor run(std::span<const SeqChunk> chunks);

  // The metadata of a decode step padded to `batch` rows: the layout every decode step uses,
  // eager or graph (max_context_len = max_model_len, so both pick the same attention split).
  backend::StepMetadata metadata(int batch) const;
  int num_captured() const { return int(graphs_.size()); }
  // The captured batch buckets, ascending.
  std::vector<int> captured() const;
  // Drops every captured bucket not in `buckets` (those batch sizes then run in the next larger
  // kept bucket, or eagerly): the ranks of a parallel group keep the buckets they all captured.
  void keep_only(const std::vector<int>& buckets);

 private:
  void fill_host(std::span<const SeqChunk> chunks, int batch);
  int bucket_for(int batch) const;

  backend::Backend& b_;
  int max_batch_, max_model_len_, block_size_, max_blocks_;
  StagingRing host_;  // the packed int32 metadata, filled on the host
  Tensor device_;     // what the graphs read
  struct Graph {
    std::unique_ptr<backend::StepGraph> graph;
    Tensor logits;
  };
  std::map<int, Graph> graphs_;
};

}  // namespace serval::runtime
