#include "model/layers/dummy_load.h"

#include <fmt/format.h>

#include "base/error.h"
#include "model/layers/layers.h"
#include "model/quantized_weight.h"
#include "quant/weight_names.h"

namespace serval::model {

namespace {

using Method = quant::QuantConfig::Method;

// Elements per row of a tensor of `shape` viewed as [shape[0], rest] (1 for 1-D tensors).
int64_t row_length(const Shape& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// Rows `rows` of the whole dummy tensor `name` of `shape`, from its column `col0` on: the
// counters of those elements in the host tensor.
backend::DummyBlock block_of(const WeightSource& w, const std::string& name, const Shape& shape,
                             dist::Range rows, int64_t col0) {
  backend::DummyBlock b = w.dummy_dense(name, shape).blocks.at(0);
  b.rows = rows.size();
  b.offset = rows.begin * row_length(shape) + col0;
  b.row_stride = row_length(shape);
  return b;
}

// The description of a quantized linear (experts == 0) or stack of `experts` linears [n, k]
// fused from `modules` (rows `rows` each), keyed by `name`.
backend::DummyQuantized quantized_meta(const WeightSource& w, const std::string& name,
                                       const std::vector<std::string>& modules,
                                       const std::vector<int64_t>& rows, int64_t k, int experts) {
  const quant::QuantConfig& c = w.quant_config();
  int64_t n = 0;
  for (size_t i = 0; i < modules.size(); ++i) {
    quant::linear_tensors(c, modules[i], rows[i], k, DType::kBF16);  // checks k for NVFP4
    n += rows[i];
  }
  backend::DummyQuantized d = w.dummy_quantized(name);
  backend::QuantizedWeight& q = d.meta;
  q.format = weight_format(c.method);
  q.experts = experts;
  q.n = int(n);
  q.k = int(k);
  const size_t copies = size_t(experts > 0 ? experts : 1);
  q.global_scale.assign(copies, q.global_scale.at(0));
  q.input_scale.assign(copies, q.input_scale.at(0));
  if (c.method == Method::kFp8Block) {
    quant::check_block_fusable(modules[0], rows, c.block_size[0]);
    q.block_n = c.block_size[0];
    q.block_k = c.block_size[1];
  }
  q.quantize_activations = c.method == Method::kNvfp4 && c.nvfp4_activations;
  return d;
}

std::string joined(const std::vector<std::string>& modules) {
  std::string s;
  for (const std::string& m : modules) s += (s.empty() ? "" : "+") + m;
  return s;
}

}  // namespace

bool device_dummy(const WeightSource& w, const backend::Backend& b) {
  return w.is_dummy() && b.generates_dummy_weights();
}

Tensor load_dense_rows(const WeightSource& w, backend::Backend& b,
                       const std::vector<DenseRows>& parts) {
  check(!parts.empty(), "load_dense_rows: no parts");
  if (!device_dummy(w, b)) {
    std::vector<Tensor> kept;
    for (const DenseRows& p : parts) {
      Tensor t = w.get(p.name, p.shape);
      const int64_t whole = p.shape.empty() ? 1 : p.shape[0];
      kept.push_back(p.rows == dist::Range{0, whole} ? t : slice_rows(t, p.rows));
    }
    return b.upload_weight(kept.size() == 1 ? kept[0] : concat_rows(kept));
  }
  backend::DummyDense d;
  d.dtype = w.dummy_dense(parts[0].name, parts[0].shape).dtype;
  d.cols = row_length(parts[0].shape);
  int64_t rows = 0;
  for (const DenseRows& p : parts) {
    if (row_length(p.shape) != d.cols)
      throw InvalidArgument("load_dense_rows: '" + p.name + "' has rows of " +
                            std::to_string(row_length(p.shape)) + " elements, expected " +
                            std::to_string(d.cols));
    d.blocks.push_back(block_of(w, p.name, p.shape, p.rows, 0));
    rows += p.rows.size();
  }
  d.shape = parts[0].shape.empty() ? Shape{rows} : parts[0].shape;
  d.shape[0] = rows;
  return b.dummy_dense(d);
}

Tensor load_dense(const WeightSource& w, backend::Backend& b, const std::string& name,
                  const Shape& shape) {
  return load_dense_rows(w, b, {{name, shape, {0, shape.empty() ? 1 : shape[0]}}});
}

backend::Weight load_linear_sharded(const WeightSource& w, backend::Backend& b,
                                    const std::vector<ShardedLinearPart>& parts, int64_t k,
                                    dist::Range cols, bool gate_up) {
  check(!parts.empty(), "load_linear_sharded: no parts");
  check(!gate_up || (parts.size() == 2 && parts[0].keep.size() == parts[1].keep.size()),
        "load_linear_sharded: gate_up needs two parts of equal size");
  if (!device_dummy(w, b)) {
    backend::Weight host = read_linear_sharded(w, parts, k, cols);
    if (host.q) {
      host.q->gate_up = gate_up;
      return {Tensor{}, b.upload_quantized(*host.q)};
    }
    return {b.upload_weight(host.dense), std::nullopt};
  }
  std::vector<std::string> modules;
  std::vector<int64_t> rows;
  for (const ShardedLinearPart& p : parts) {
    modules.push_back(p.module);
    rows.push_back(p.rows);
  }
  if (!quant::shards_quantized(w.quant_config(), modules)) {
    backend::DummyDense d;
    d.dtype = w.dummy_dense(parts[0].module + ".weight", {parts[0].rows, k}).dtype;
    d.cols = cols.size();
    int64_t n = 0;
    for (const ShardedLinearPart& p : parts) {
      d.blocks.push_back(block_of(w, p.module + ".weight", {p.rows, k}, p.keep, cols.begin));
      n += p.keep.size();
    }
    d.shape = {n, cols.size()};
    return {b.dummy_dense(d), std::nullopt};
  }
  // A tensor-parallel shard is a dummy weight of the kept shape of its own (named with its
  // slice, so ranks differ); dummy values are not slices of one whole weight.
  std::vector<int64_t> kept;
  for (const ShardedLinearPart& p : parts) kept.push_back(p.keep.size());
  std::string name = joined(modules);
  if (kept != rows || cols != dist::Range{0, k})
    name += fmt::format(" rows [{}, {}) cols [{}, {})", parts[0].keep.begin, parts[0].keep.end,
                        cols.begin, cols.end);
  backend::DummyQuantized d = quantized_meta(w, name, modules, kept, cols.size(), 0);
  d.meta.gate_up = gate_up;
  return {Tensor{}, b.dummy_quantized(d)};
}

void load_dummy_experts(const WeightSource& w, backend::Backend& b,
                        const std::function<std::string(int e, int proj)>& module,
                        dist::Range experts, int64_t inter, dist::Range keep, int64_t hidden,
                        backend::MoeWeights& out) {
  const quant::QuantConfig& c = w.quant_config();
  const int L = int(experts.size());
  const int64_t I = keep.size(), H = hidden;
  check(L > 0, "load_dummy_experts: no experts");
  const int first = int(experts.begin);
  const bool quantized = quant::is_quantized(c, module(first, 0));
  for (int e = first; e < int(experts.end); ++e)
    for (int proj = 0; proj < 3; ++proj)
      if (quant::is_quantized(c, module(e, proj)) != quantized)
        throw LoadError(c.source + ": the experts of '" + module(first, 0) +
                        "' mix quantized and unquantized projections (expert " + std::to_string(e) +
                        "); they need one format");
  if (!quantized) {
    backend::DummyDense gate_up, down;
    gate_up.dtype = down.dtype = w.dummy_dense(module(first, 0) + ".weight", {inter, H}).dtype;
    gate_up.shape = {L, 2 * I, H};
    gate_up.cols = H;
    down.shape = {L, H, I};
    down.cols = I;
    for (int e = first; e < int(experts.end); ++e) {
      for (int proj = 0; proj < 2; ++proj)
        gate_up.blocks.push_back(block_of(w, module(e, proj) + ".weight", {inter, H}, keep, 0));
      down.blocks.push_back(block_of(w, module(e, 2) + ".weight", {H, inter}, {0, H}, keep.begin));
    }
    out.gate_up = b.dummy_dense(gate_up);
    out.down = b.dummy_dense(down);
    return;
  }
  // Tensor parallel keeps intermediate rows `keep` of gate/up and the same columns of down.
  std::string stack = fmt::format(" experts [{}, {})", experts.begin, experts.end);
  if (keep != dist::Range{0, inter}) stack += fmt::format(" inter [{}, {})", keep.begin, keep.end);
  const std::vector<std::string> gu{module(first, 0), module(first, 1)}, dn{module(first, 2)};
  out.gate_up_q = b.dummy_quantized(quantized_meta(w, joined(gu) + stack, gu, {I, I}, H, L));
  out.down_q = b.dummy_quantized(quantized_meta(w, joined(dn) + stack, dn, {H}, I, L));
}

}  // namespace serval::model
