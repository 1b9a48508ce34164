// Host-side slicing of dense weights for tensor-parallel shards (before upload).
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

// The linear of `parts` stacked along the output rows, each keeping its `keep` rows, with input
// columns `cols` of the full in_features `k`. When nothing is sliced this is read_linear. A
// quantized weight that would be sliced is a LoadError (tensor parallel does not slice packed
// NVFP4 / FP8 blocks yet) naming the module.
backend::Weight read_linear_sharded(const WeightSource& w,
                                    const std::vector<ShardedLinearPart>& parts, int64_t k,
                                    dist::Range cols);

}  // namespace serval::model
