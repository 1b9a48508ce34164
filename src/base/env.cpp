#include "base/env.h"

#include <charconv>
#include <cstdlib>
#include <system_error>

#include "base/log.h"

namespace serval {

std::optional<long long> parse_int_in(std::string_view text, long long lo, long long hi) {
  long long value = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || at != end || value < lo || value > hi)
    return std::nullopt;
  return value;
}

int env_int(const char* name, int lo, int hi, int fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr) return fallback;
  if (const std::optional<long long> v = parse_int_in(env, lo, hi)) return int(*v);
  log::warn("{}='{}' is not a whole number in {}..{}: using {}", name, env, lo, hi, fallback);
  return fallback;
}

}  // namespace serval
