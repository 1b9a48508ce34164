// Monotonic and wall clocks in the units the metrics use.
#pragma once
#include <chrono>
#include <cstdint>

namespace serval {

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

inline int64_t unix_time_seconds() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace serval
