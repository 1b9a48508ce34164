#include "model/layers/shard.h"

#include <cstring>

#include "base/error.h"
#include "model/layers/layers.h"

namespace serval::model {

Tensor slice_rows(const Tensor& t, dist::Range r) {
  check(r.begin >= 0 && r.end <= t.dim(0) && r.begin <= r.end, "slice_rows: range in tensor");
  Shape shape = t.shape;
  shape[0] = r.size();
  Tensor out = host_empty(t.dtype, shape);
  const size_t row_bytes = t.dim(0) > 0 ? t.nbytes() / size_t(t.dim(0)) : 0;
  std::memcpy(out.data, static_cast<const char*>(t.data) + size_t(r.begin) * row_bytes,
              out.nbytes());
  return out;
}

Tensor slice_cols(const Tensor& t, dist::Range r) {
  check(t.rank() == 2, "slice_cols: 2-D tensor");
  const int64_t rows = t.dim(0), cols = t.dim(1);
  check(r.begin >= 0 && r.end <= cols && r.begin <= r.end, "slice_cols: range in tensor");
  check(dtype_bits(t.dtype) % 8 == 0, "slice_cols: whole-byte dtype");
  const size_t elem = dtype_bits(t.dtype) / 8;
  Tensor out = host_empty(t.dtype, {rows, r.size()});
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(out.data) + size_t(i * r.size()) * elem,
                static_cast<const char*>(t.data) + size_t(i * cols + r.begin) * elem,
                size_t(r.size()) * elem);
  return out;
}

backend::Weight read_linear_sharded(const WeightSource& w,
                                    const std::vector<ShardedLinearPart>& parts, int64_t k,
                                    dist::Range cols) {
  bool sliced = cols.begin != 0 || cols.end != k;
  std::vector<LinearShard> shards;
  for (const ShardedLinearPart& p : parts) {
    sliced = sliced || p.keep.begin != 0 || p.keep.end != p.rows;
    shards.push_back({p.module, p.rows});
  }
  if (!sliced) return read_linear(w, shards, k);
  std::vector<Tensor> kept;
  for (const ShardedLinearPart& p : parts) {
    backend::Weight full = read_linear(w, {{p.module, p.rows}}, k);
    if (full.quantized())
      throw LoadError(w.quant_config().source + ": '" + p.module + "' is quantized (" +
                      std::string(backend::weight_format_name(full.q->format)) +
                      "); tensor parallel does not slice quantized weights yet (use "
                      "--tensor-parallel-size 1, or --enable-expert-parallel for MoE experts)");
    Tensor t = slice_rows(full.dense, p.keep);
    if (cols.begin != 0 || cols.end != k) t = slice_cols(t, cols);
    kept.push_back(std::move(t));
  }
  return {kept.size() == 1 ? kept[0] : concat_rows(kept), std::nullopt};
}

}  // namespace serval::model
