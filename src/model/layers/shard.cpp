#include "model/layers/shard.h"

#include <cstring>

#include "base/error.h"
#include "base/math.h"
#include "model/layers/layers.h"
#include "quant/quant_config.h"

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

backend::QuantizedWeight slice_quantized(const backend::QuantizedWeight& q,
                                         const std::vector<dist::Range>& rows, dist::Range cols,
                                         const std::string& what) {
  using kernels::WeightFormat;
  check(q.experts == 0, "slice_quantized: one linear, not an expert stack");
  const std::string where = what + " (" + std::string(backend::weight_format_name(q.format)) + ")";
  if (cols.begin < 0 || cols.end > q.k || cols.begin >= cols.end)
    throw LoadError(where + ": input columns [" + std::to_string(cols.begin) + ", " +
                    std::to_string(cols.end) + ") are not inside [0, " + std::to_string(q.k) + ")");
  // A slice boundary must fall on a scale boundary: an NVFP4 group (16 columns) or an FP8 block.
  auto aligned = [](dist::Range r, int64_t unit, int64_t whole) {
    return r.begin % unit == 0 && (r.end % unit == 0 || r.end == whole);
  };
  const int64_t col_unit = q.format == WeightFormat::kNvfp4      ? 16
                           : q.format == WeightFormat::kFp8Block ? q.block_k
                                                                 : 1;
  if (!aligned(cols, col_unit, q.k))
    throw LoadError(where + ": the tensor-parallel input columns [" + std::to_string(cols.begin) +
                    ", " + std::to_string(cols.end) + ") do not fall on " +
                    std::to_string(col_unit) + "-column scale boundaries");
  const int64_t row_unit = q.format == WeightFormat::kFp8Block ? q.block_n : 1;
  int64_t n = 0;
  for (const dist::Range& r : rows) {
    if (r.begin < 0 || r.end > q.n || r.begin >= r.end || !aligned(r, row_unit, q.n))
      throw LoadError(where + ": the tensor-parallel rows [" + std::to_string(r.begin) + ", " +
                      std::to_string(r.end) + ") are not inside [0, " + std::to_string(q.n) +
                      ") on " + std::to_string(row_unit) + "-row scale boundaries");
    n += r.size();
  }
  // Rows of every range, then columns `c` of the result (a no-op when c is the whole width).
  auto take = [&](const Tensor& t, const std::vector<dist::Range>& rs, dist::Range c) {
    std::vector<Tensor> parts;
    for (const dist::Range& r : rs) parts.push_back(slice_rows(t, r));
    Tensor out = parts.size() == 1 ? parts[0] : concat_rows(parts);
    return c == dist::Range{0, t.rank() == 2 ? t.dim(1) : 1} ? out : slice_cols(out, c);
  };
  backend::QuantizedWeight out = q;
  out.n = int(n);
  out.k = int(cols.size());
  switch (q.format) {
    case WeightFormat::kNvfp4:  // u8 [n, k/2] (two codes per byte), e4m3 scales [n, k/16]
      out.data = take(q.data, rows, {cols.begin / 2, cols.end / 2});
      out.scales = take(q.scales, rows, {cols.begin / 16, cols.end / 16});
      break;
    case WeightFormat::kFp8PerTensor:  // e4m3 [n, k]; one scale
      out.data = take(q.data, rows, cols);
      break;
    case WeightFormat::kFp8PerChannel:  // e4m3 [n, k]; f32 scales [n]
      out.data = take(q.data, rows, cols);
      out.scales = take(q.scales, rows, {0, 1});
      break;
    case WeightFormat::kFp8Block: {  // e4m3 [n, k]; f32 scales [ceil(n/bn), ceil(k/bk)]
      out.data = take(q.data, rows, cols);
      std::vector<dist::Range> block_rows;
      for (const dist::Range& r : rows)
        block_rows.push_back({r.begin / q.block_n, ceil_div<int64_t>(r.end, q.block_n)});
      out.scales = take(q.scales, block_rows,
                        {cols.begin / q.block_k, ceil_div<int64_t>(cols.end, q.block_k)});
      break;
    }
  }
  return out;
}

backend::Weight read_linear_sharded(const WeightSource& w,
                                    const std::vector<ShardedLinearPart>& parts, int64_t k,
                                    dist::Range cols) {
  bool sliced = cols.begin != 0 || cols.end != k;
  std::vector<LinearShard> shards;
  std::vector<std::string> modules;
  for (const ShardedLinearPart& p : parts) {
    sliced = sliced || p.keep.begin != 0 || p.keep.end != p.rows;
    shards.push_back({p.module, p.rows});
    modules.push_back(p.module);
  }
  if (!sliced) return read_linear(w, shards, k);
  if (quant::shards_quantized(w.quant_config(), modules)) {
    // Fused whole (one set of fused global scales, as on one GPU), then sliced.
    backend::Weight full = read_linear(w, shards, k);
    std::vector<dist::Range> rows;
    int64_t row0 = 0;
    std::string what;
    for (const ShardedLinearPart& p : parts) {
      rows.push_back({row0 + p.keep.begin, row0 + p.keep.end});
      row0 += p.rows;
      what += (what.empty() ? "'" : "+'") + p.module + "'";
    }
    return {Tensor{}, slice_quantized(*full.q, rows, cols, w.quant_config().source + ": " + what)};
  }
  std::vector<Tensor> kept;
  for (const ShardedLinearPart& p : parts) {
    Tensor t = w.get(p.module + ".weight", {p.rows, k});
    t = slice_rows(t, p.keep);
    if (cols.begin != 0 || cols.end != k) t = slice_cols(t, cols);
    kept.push_back(std::move(t));
  }
  return {kept.size() == 1 ? kept[0] : concat_rows(kept), std::nullopt};
}

}  // namespace serval::model
