// Comparisons the tests share.
#pragma once
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

}  // namespace serval::testing
