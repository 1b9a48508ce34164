#include "runtime/model_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace serval::runtime {

namespace {

// Points `view` (into `from`'s storage) at the same offset inside `to`.
Tensor rebase(const Tensor& view, const Tensor& from, const Tensor& to) {
  Tensor t = to;
  t.data = static_cast<char*>(to.data) +
           (static_cast<const char*>(view.data) - static_cast<const char*>(from.data));
  t.shape = view.shape;
  return t;
}

}  // namespace

backend::StepMetadata build_step_metadata(std::span<const SeqChunk> chunks, int block_size) {
  std::vector<int32_t> ids, positions, slots, query_start{0}, context_lens, logits_rows;
  int max_blocks = 1;
  for (const SeqChunk& c : chunks) max_blocks = std::max(max_blocks, int(c.block_table.size()));
  std::vector<int32_t> tables(chunks.size() * max_blocks, 0);
  for (size_t s = 0; s < chunks.size(); ++s) {
    const SeqChunk& c = chunks[s];
    check(c.num_new > 0 && c.start + c.num_new <= int(c.tokens.size()), "chunk within tokens");
    check(int(c.block_table.size()) * block_size >= c.start + c.num_new, "chunk has its blocks");
    for (int i = 0; i < c.num_new; ++i) {
      int pos = c.start + i;
      ids.push_back(c.tokens[pos]);
      positions.push_back(pos);
      slots.push_back(c.block_table[pos / block_size] * block_size + pos % block_size);
    }
    const int first_row = query_start.back();
    query_start.push_back(first_row + c.num_new);
    context_lens.push_back(c.start + c.num_new);
    std::copy(c.block_table.begin(), c.block_table.end(), tables.begin() + s * max_blocks);
    switch (c.logits) {
      case SeqChunk::Logits::kNone:
        break;
      case SeqChunk::Logits::kLast:
        logits_rows.push_back(query_start.back() - 1);
        break;
      case SeqChunk::Logits::kAll:
        for (int i = 0; i < c.num_new; ++i) logits_rows.push_back(first_row + i);
        break;
    }
  }
  backend::StepMetadata m;
  m.num_tokens = int(ids.size());
  m.num_seqs = int(chunks.size());
  m.max_blocks_per_seq = max_blocks;
  m.num_logits = int(logits_rows.size());
  for (size_t s = 0; s < chunks.size(); ++s) {
    m.max_query_len = std::max(m.max_query_len, chunks[s].num_new);
    m.max_context_len = std::max(m.max_context_len, context_lens[s]);
  }
  // All arrays live in one buffer, so one copy moves a step's metadata to the device.
  std::vector<std::pair<const std::vector<int32_t>*, Tensor*>> arrays = {
      {&ids, &m.token_ids},
      {&positions, &m.positions},
      {&slots, &m.slot_mapping},
      {&query_start, &m.query_start},
      {&context_lens, &m.context_lens},
      {&tables, &m.block_tables},
      {&logits_rows, &m.logits_indices}};
  int64_t total = 0;
  for (const auto& [v, t] : arrays) total += int64_t(v->size());
  m.packed = host_empty(DType::kI32, {total});
  int64_t at = 0;
  for (const auto& [v, t] : arrays) {
    std::copy(v->begin(), v->end(), m.packed.as<int32_t>() + at);
    *t = m.packed;
    t->data = m.packed.as<int32_t>() + at;
    t->shape = {int64_t(v->size())};
    at += int64_t(v->size());
  }
  m.block_tables.shape = {m.num_seqs, max_blocks};
  return m;
}

void StepRunner::launch_greedy(std::span<const SeqChunk>) {
  throw Error("this runner has no token feedback (launch_greedy)");
}

std::vector<int32_t> StepRunner::collect_greedy() {
  throw Error("this runner has no token feedback (collect_greedy)");
}

int64_t ModelRunner::kv_bytes_per_token(const model::KvGeometry& g, DType kv_dtype) {
  return int64_t(g.num_layers) * (g.values ? 2 : 1) * g.num_kv_heads * g.head_dim *
         dtype_bits(kv_dtype) / 8;
}

ModelRunner::ModelRunner(std::unique_ptr<backend::Backend> backend,
                         std::unique_ptr<model::Model> model, int num_blocks, int block_size,
                         const RunnerOptions& options)
    : backend_(std::move(backend)),
      model_(std::move(model)),
      block_size_(block_size),
      options_(options) {
  const model::KvGeometry g = model_->kv_geometry();
  const DType kv_dtype = options_.kv_cache_dtype.value_or(backend_->kv_cache_dtype());
  for (int i = 0; i < g.num_layers; ++i) {
    backend::KvCacheLayer layer;
    layer.k = backend_->empty(kv_dtype, {num_blocks, block_size, g.num_kv_heads, g.head_dim});
    if (g.values)
      layer.v = backend_->empty(kv_dtype, {num_blocks, block_size, g.num_kv_heads, g.head_dim});
    layer.block_size = block_size;
    if (!options_.k_scales.empty()) layer.k_scale = options_.k_scales.at(i);
    if (!options_.v_scales.empty()) layer.v_scale = options_.v_scales.at(i);
    kv_.push_back(std::move(layer));
  }
  if (options_.step_memory_bytes > 0) backend_->reserve_step_memory(options_.step_memory_bytes);
  if (options_.token_feedback_rows > 0)
    sampled_ids_ = backend_->empty(DType::kI32, {options_.token_feedback_rows});
  for (QueuedIds& slot : slots_) slot.done = backend_->make_mark();
  staging_ = std::make_unique<StagingRing>(*backend_);
  if (!options_.defer_graph_capture) {
    warm_up_decode_graphs();
    capture_decode_graphs();
  }
}

DecodeGraphs* ModelRunner::decode_graphs() {
  if (!graphs_ && options_.cuda_graphs && options_.max_model_len > 0 &&
      options_.max_decode_batch > 0) {
    graphs_ = std::make_unique<DecodeGraphs>(*backend_, options_.max_decode_batch,
                                             options_.max_model_len, block_size_);
  }
  return graphs_.get();
}

void ModelRunner::capture_decode_graphs() {
  DecodeGraphs* graphs = decode_graphs();
  if (graphs == nullptr || graphs_captured_) return;
  graphs_captured_ = true;
  graphs->capture_all([this](const backend::StepMetadata& meta) { return run_model(meta); });
}

void ModelRunner::warm_up_decode_graphs() {
  if (DecodeGraphs* graphs = decode_graphs())
    graphs->warm_up([this](const backend::StepMetadata& meta) { return run_model(meta); });
}

Tensor ModelRunner::run_model(const backend::StepMetadata& meta) {
  if (options_.token_feedback_rows > 0) {
    Tensor ids = meta.token_ids;  // a view: the device copy of the step's ids
    backend_->resolve_pending_tokens(ids, sampled_ids_);
  }
  return model_->forward(meta, kv_);
}

void ModelRunner::check_pending_tokens(std::span<const SeqChunk> chunks) const {
  for (const SeqChunk& c : chunks) {
    for (int i = c.start; i < c.start + c.num_new && i < int(c.tokens.size()); ++i) {
      const int32_t id = c.tokens[i];
      if (id >= 0) continue;
      const int64_t row = -(int64_t(id) + 1);
      if (row >= sampled_rows_)
        throw InvalidArgument(fmt::format(
            "pending token {} at position {} names row {} of the previous greedy step, which "
            "left {} rows on the device{}",
            id, i, row, sampled_rows_,
            options_.token_feedback_rows > 0 ? "" : " (token feedback is off)"));
    }
  }
}

ModelRunner::~ModelRunner() = default;

std::vector<int> ModelRunner::decode_graph_buckets() const {
  return graphs_ ? graphs_->captured() : std::vector<int>{};
}

void ModelRunner::keep_decode_graph_buckets(const std::vector<int>& buckets) {
  if (graphs_) graphs_->keep_only(buckets);
}

int ModelRunner::num_decode_graphs() const {
  return graphs_ ? graphs_->num_captured() : 0;
}

Tensor ModelRunner::forward(std::span<const SeqChunk> chunks) {
  // The kernels assume at least one token (an empty step divided by zero on the CPU).
  int tokens = 0;
  for (const SeqChunk& c : chunks) tokens += c.num_new;
  if (tokens == 0) throw InvalidArgument("ModelRunner: a step needs at least one new token");
  check_pending_tokens(chunks);
  backend_->begin_step();
  if (graphs_ && graphs_->can_run(chunks)) return graphs_->run(chunks);
  backend::StepMetadata meta = build_step_metadata(chunks, block_size_);
  meta.dp_row_offset = dp_row_offset_;
  meta.dp_rows_total = dp_rows_total_;
  // Every pure decode step, eager or graph, bounds the context by max_model_len so that the
  // attention kernel splits the same way and graph replays equal eager runs of the same (bucket)
  // batch size bit for bit (other batch sizes split differently: equal up to rounding).
  if (options_.max_model_len > 0 && meta.max_query_len == 1)
    meta.max_context_len = std::max(meta.max_context_len, options_.max_model_len);
  // Through staging memory: the copy may queue behind the step before (no wait for the device).
  void* staged = staging_->next(meta.packed.nbytes());
  std::memcpy(staged, meta.packed.data, meta.packed.nbytes());
  Tensor device = backend_->empty(DType::kI32, meta.packed.shape);
  backend_->copy_to_device(staged, device);
  staging_->copy_queued();
  for (Tensor* t : {&meta.token_ids, &meta.positions, &meta.slot_mapping, &meta.query_start,
                    &meta.context_lens, &meta.block_tables, &meta.logits_indices}) {
    *t = rebase(*t, meta.packed, device);
  }
  meta.packed = device;
  return run_model(meta);
}

std::vector<float> ModelRunner::execute(std::span<const SeqChunk> chunks) {
  Tensor logits = forward(chunks);
  sampled_rows_ = 0;  // the next step follows this one, which sampled nothing on the device
  std::vector<float> out(size_t(logits.numel()));
  backend_->download(logits, out.data());
  backend_->end_step();
  return out;
}

std::vector<int32_t> ModelRunner::execute_greedy(std::span<const SeqChunk> chunks) {
  launch_greedy(chunks);
  return collect_greedy();
}

void ModelRunner::launch_greedy(std::span<const SeqChunk> chunks) {
  if (queued_ == 2) throw InvalidArgument("launch_greedy: two greedy steps are queued already");
  Tensor logits = forward(chunks);
  const int64_t rows = logits.dim(0);
  // Ids the next step may name stay on the device; a larger step's go to step memory.
  const bool kept = rows <= options_.token_feedback_rows;
  Tensor ids = kept ? sampled_ids_.rows(0, rows) : backend_->empty(DType::kI32, {rows});
  backend_->argmax(logits, ids);
  sampled_rows_ = kept ? int(rows) : 0;
  QueuedIds& slot = slots_[(oldest_ + queued_) % 2];  // free: at most one other is queued
  if (slot.capacity < rows) {
    slot.capacity = std::max<int64_t>(rows, 256);
    slot.host = backend_->host_staging(size_t(slot.capacity) * sizeof(int32_t));
  }
  backend_->download_async(ids, slot.host.get());
  slot.done->record();
  slot.rows = rows;
  ++queued_;
  backend_->end_step();
}

std::vector<int32_t> ModelRunner::collect_greedy() {
  if (queued_ == 0) throw InvalidArgument("collect_greedy: no greedy step is queued");
  QueuedIds& slot = slots_[oldest_];
  slot.done->wait();
  const auto* ids = static_cast<const int32_t*>(slot.host.get());
  std::vector<int32_t> out(ids, ids + slot.rows);
  oldest_ = (oldest_ + 1) % 2;
  --queued_;
  return out;
}

}  // namespace serval::runtime
