// Logging through spdlog; one logger for the whole process.
#pragma once
#include <spdlog/spdlog.h>

namespace serval::log {

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::trace;
using spdlog::warn;

// Whether trace lines are written (SERVAL_LOG_LEVEL=trace): for call sites that would otherwise
// compute their arguments on every call.
inline bool tracing() {
  return spdlog::should_log(spdlog::level::trace);
}

// Sets the level from SERVAL_LOG_LEVEL (trace/debug/info/warn/error) or `fallback`.
void init(spdlog::level::level_enum fallback = spdlog::level::info);

}  // namespace serval::log
