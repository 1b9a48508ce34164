// Comparisons the tests share.
#pragma once
#include <algorithm>
#include <cmath>
#include <span>

namespace serval::testing {

// Relative L2 error ‖got − want‖ / ‖want‖, accumulated in double. Sizes must match.
inline double rel_l2(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

// Top-1 minus top-2 of a logits row (at least two entries).
inline float top_margin(std::span<const float> row) {
  float first = -INFINITY, second = -INFINITY;
  for (float v : row) {
    second = std::max(second, std::min(first, v));
    first = std::max(first, v);
  }
  return first - second;
}

// Largest |a[i] − b[i]|. Sizes must match.
inline float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

}  // namespace serval::testing
