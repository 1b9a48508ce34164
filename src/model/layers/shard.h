// Host-side slicing of dense and quantized weights for tensor-parallel shards (before upload).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/layout.h"
#include "model/quantized_weight.h"
#include "model/weight_source.h"

namespace serval::model {

// Rows [r.begin, r.end) of a 2-D (or higher) host tensor, as a copy.
Tensor slice_rows(const Tensor& t, dist::Range r);
// Columns [r.begin, r.end) of a 2-D host tensor [rows, cols], as a copy.
Tensor slice_cols(const Tensor& t, dist::Range r);

// One fused part of a sharded linear: the module, its full output rows, and the rows kept.
struct ShardedLinearPart {
  std::string module;
  int64_t rows = 0;
  dist::Range keep;
};

// Rows `rows` (ranges of q's rows, kept in this order) and input columns `cols` of the quantized
// linear q [n, k] (experts == 0): data, scales and the scale grid sliced alike; global and input
// scales kept. Boundaries must fall on scale boundaries: NVFP4 columns on 16-column groups, FP8
// block rows / columns on block_n / block_k (a range may end at n or k); else a LoadError naming
// `what`.
backend::QuantizedWeight slice_quantized(const backend::QuantizedWeight& q,
                                         const std::vector<dist::Range>& rows, dist::Range cols,
                                         const std::string& what);

// The linear of `parts` stacked along the output rows, each keeping its `keep` rows, with input
// columns `cols` of the full in_features `k`. When nothing is sliced this is read_linear. A
// quantized linear is read and fused whole (read_linear: the same fused global scales on every
// rank as on one GPU), then sliced with slice_quantized.
backend::Weight read_linear_sharded(const WeightSource& w,
                                    const std::vector<ShardedLinearPart>& parts, int64_t k,
                                    dist::Range cols);

}  // namespace serval::model
