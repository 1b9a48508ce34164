#include "runtime/decode_graphs.h"

#include <algorithm>

#include "base/log.h"
#include "base/math.h"
#include "runtime/model_runner.h"

namespace serval::runtime {

namespace {

// Offsets (in int32 elements) of the packed metadata arrays for max_batch rows.
struct Packed {
  int64_t token_ids, positions, slots, query_start, context_lens, logits_rows, block_tables, total;
};

Packed packed_layout(int max_batch, int max_blocks) {
  Packed p{};
  int64_t at = 0;
  for (int64_t* field :
       {&p.token_ids, &p.positions, &p.slots, &p.query_start, &p.context_lens, &p.logits_rows}) {
    *field = at;
    at += max_batch + 1;
  }
  p.block_tables = at;
  p.total = at + int64_t(max_batch) * max_blocks;
  return p;
}

Tensor view(const Tensor& base, int64_t offset, Shape shape) {
  Tensor t = base;
  t.data = base.as<int32_t>() + offset;
  t.shape = std::move(shape);
  return t;
}

}  // namespace

std::vector<int> decode_graph_buckets(int max_batch) {
  std::vector<int> sizes;
  for (int b : {1, 2, 4})
    if (b <= max_batch) sizes.push_back(b);
  for (int b = 8; b <= std::min(max_batch, 256); b += 8) sizes.push_back(b);
  for (int b = 272; b <= max_batch; b += 16) sizes.push_back(b);
  if (sizes.empty() || sizes.back() < max_batch) sizes.push_back(max_batch);
  return sizes;
}

DecodeGraphs::DecodeGraphs(backend::Backend& b, int max_batch, int max_model_len, int block_size)
    : b_(b),
      max_batch_(max_batch),
      max_model_len_(max_model_len),
      block_size_(block_size),
      max_blocks_(ceil_div(max_model_len, block_size)),
      host_(b) {
  const Packed p = packed_layout(max_batch_, max_blocks_);
  device_ = b_.empty(DType::kI32, {p.total});
}

int DecodeGraphs::bucket_for(int batch) const {
  for (const auto& [size, graph] : graphs_)
    if (size >= batch) return size;
  return 0;
}

backend::StepMetadata DecodeGraphs::metadata(int batch) const {
  const Packed p = packed_layout(max_batch_, max_blocks_);
  backend::StepMetadata m;
  m.num_tokens = m.num_seqs = m.num_logits = batch;
  m.max_blocks_per_seq = max_blocks_;
  m.max_query_len = 1;
  m.max_context_len = max_model_len_;
  m.token_ids = view(device_, p.token_ids, {batch});
  m.positions = view(device_, p.positions, {batch});
  m.slot_mapping = view(device_, p.slots, {batch});
  m.query_start = view(device_, p.query_start, {batch + 1});
  m.context_lens = view(device_, p.context_lens, {batch});
  m.logits_indices = view(device_, p.logits_rows, {batch});
  m.block_tables = view(device_, p.block_tables, {batch, max_blocks_});
  return m;
}

// Padding rows decode token 0 at position 0 of a one-token context in block 0 and write no KV
// (slot −1); their logits are ignored.
// Only the prefix a graph of `batch` rows reads is written and copied: the per-row arrays and the
// first `batch` block-table rows (with 256 sequences of 40k context the whole buffer is ~2.6 MB,
// too much to rewrite and copy every decode step).
void DecodeGraphs::fill_host(std::span<const SeqChunk> chunks, int batch) {
  const Packed p = packed_layout(max_batch_, max_blocks_);
  const int64_t used = p.block_tables + int64_t(batch) * max_blocks_;
  auto* host = static_cast<int32_t*>(host_.next(size_t(used) * sizeof(int32_t)));
  std::fill(host, host + used, 0);
  for (int i = 0; i <= batch; ++i) host[p.query_start + i] = i;
  for (int i = 0; i < batch; ++i) {
    host[p.logits_rows + i] = i;
    host[p.slots + i] = -1;
    host[p.context_lens + i] = 1;
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SeqChunk& c = chunks[i];
    const int pos = c.start;
    host[p.token_ids + i] = c.tokens[pos];
    host[p.positions + i] = pos;
    host[p.slots + i] = c.block_table[pos / block_size_] * block_size_ + pos % block_size_;
    host[p.context_lens + i] = pos + 1;
    std::copy(c.block_table.begin(), c.block_table.end(),
              host + p.block_tables + int64_t(i) * max_blocks_);
  }
  Tensor prefix = view(device_, 0, {used});
  b_.copy_to_device(host, prefix);
  host_.copy_queued();
}

void DecodeGraphs::warm_up(const Forward& forward) {
  for (int batch : decode_graph_buckets(max_batch_)) {
    log::debug("decode graphs: warm-up of batch {}", batch);
    fill_host({}, batch);
    b_.begin_step();
    forward(metadata(batch));
    b_.end_step();
  }
  b_.synchronize();
}

// No eager step runs between two captures, so the ranks of a parallel group never interleave
// eager and captured collectives.
void DecodeGraphs::capture_all(const Forward& forward) {
  for (int batch : decode_graph_buckets(max_batch_)) {
    log::debug("decode graphs: capture of batch {}", batch);
    fill_host({}, batch);
    b_.begin_step();
    Tensor logits;
    auto graph = b_.capture([&] { logits = forward(metadata(batch)); });
    b_.end_step();
    if (!graph) continue;
    graphs_[batch] = Graph{std::move(graph), logits};
  }
  log::info("captured {} CUDA graphs for decode batches up to {}", graphs_.size(), max_batch_);
}

std::vector<int> DecodeGraphs::captured() const {
  std::vector<int> out;
  for (const auto& [batch, graph] : graphs_) out.push_back(batch);
  return out;
}

void DecodeGraphs::keep_only(const std::vector<int>& buckets) {
  std::erase_if(graphs_, [&](const auto& entry) {
    return std::find(buckets.begin(), buckets.end(), entry.first) == buckets.end();
  });
}

bool DecodeGraphs::can_run(std::span<const SeqChunk> chunks) const {
  if (chunks.empty() || int(chunks.size()) > max_batch_ || bucket_for(int(chunks.size())) == 0)
    return false;
  for (const SeqChunk& c : chunks) {
    if (c.num_new != 1 || c.logits != SeqChunk::Logits::kLast) return false;
    if (c.start + 1 > max_model_len_ || int(c.block_table.size()) > max_blocks_) return false;
  }
  return true;
}

Tensor DecodeGraphs::run(std::span<const SeqChunk> chunks) {
  const int batch = bucket_for(int(chunks.size()));
  fill_host(chunks, batch);
  Graph& g = graphs_.at(batch);
  g.graph->replay();
  return g.logits.rows(0, int64_t(chunks.size()));
}

}  // namespace serval::runtime
