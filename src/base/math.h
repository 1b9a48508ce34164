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

template <std::integral Int>
constexpr bool is_pow2(Int x) {
  return x > 0 && (x & (x - 1)) == 0;
}

template <std::integral Int>
constexpr Int next_pow2(Int x) {
  Int p = 1;
  while (p < x) p <<= 1;
  return p;
}

static_assert(round_up(129, 128) == 256);
static_assert(ceil_div(7, 2) == 4);
static_assert(next_pow2(5) == 8);

}  // namespace serval
