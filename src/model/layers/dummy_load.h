// Loading onto a backend with dummy weights generated on its device (--load-format dummy on a
// backend with Backend::generates_dummy_weights): the loader describes each final tensor (after
// tensor-parallel slicing, expert-parallel selection and q/k/v or gate/up fusion) and the backend
// makes it, so no weight bytes are generated on the host or copied to the device. Every helper
// here falls back to the host path (WeightSource::get / read_linear_sharded, then upload) when
// the weights are not generated on the device.
//
// Values: dense tensors are exactly those of the host path (same counter per element of the
// whole checkpoint tensor). Quantized linears and expert stacks hold random codes keyed by the
// fused / stacked name, with the host path's statistics and scales (the backend lays them out in
// its device layout directly).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/layout.h"
#include "model/layers/shard.h"
#include "model/weight_source.h"

namespace serval::model {

// Whether `w`'s tensors are generated on `b`'s device: w.is_dummy() && b.generates_dummy_weights().
bool device_dummy(const WeightSource& w, const backend::Backend& b);

// Rows `rows` of the dense tensor `name` whose whole shape is `shape` (a row: one element of a
// 1-D tensor, else one slice along dim 0).
struct DenseRows {
  std::string name;
  Shape shape;
  dist::Range rows;
};

// The parts' rows stacked along dim 0, on `b` (upload_weight's dtype).
Tensor load_dense_rows(const WeightSource& w, backend::Backend& b,
                       const std::vector<DenseRows>& parts);
// The whole dense tensor `name` of `shape` on `b`.
Tensor load_dense(const WeightSource& w, backend::Backend& b, const std::string& name,
                  const Shape& shape);

// read_linear_sharded, then upload (upload_weight / upload_quantized); generated on the device
// when device_dummy (same LoadErrors: quantized parts cannot be sliced, shards need one format).
// gate_up: the parts are a SwiGLU MLP's gate and up projections; a quantized result is marked
// QuantizedWeight::gate_up (use it through Backend::linear_silu_mul only).
backend::Weight load_linear_sharded(const WeightSource& w, backend::Backend& b,
                                    const std::vector<ShardedLinearPart>& parts, int64_t k,
                                    dist::Range cols, bool gate_up = false);

// device_dummy only: the expert weights of one MoE layer generated on `b`: experts `experts`,
// their gate/up rows and down columns `keep` of `inter`, hidden size `hidden`. module(e, proj)
// names expert e's checkpoint module for proj 0 (gate), 1 (up), 2 (down). Sets out.gate_up and
// out.down (dense [L, 2·keep, hidden], [L, hidden, keep]) or out.gate_up_q and out.down_q
// (quantized stacks of L experts), as the host path of MoeBlock does. LoadError when the
// experts mix quantized and dense projections or a quantized expert would be sliced.
void load_dummy_experts(const WeightSource& w, backend::Backend& b,
                        const std::function<std::string(int e, int proj)>& module,
                        dist::Range experts, int64_t inter, dist::Range keep, int64_t hidden,
                        backend::MoeWeights& out);

}  // namespace serval::model
