// Integer helpers: constexpr templates, never macros.
#pragma once
#include <concepts>

namespace serval {

template <std::integral Int>
constexpr Int ceil_div(Int x, Int y) {
  return (x + y - 1) / y;
}

template <std::integral Int>
constexpr Int round_up(Int x, Int y) {
  return ceil_div(x, y) * y;
}

static_assert(round_up(129, 128) == 256);
static_assert(ceil_div(7, 2) == 4);

}  // namespace serval
