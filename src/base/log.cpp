#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace serval::log {

void init(spdlog::level::level_enum fallback) {
  auto logger = spdlog::stderr_color_mt("serval");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  const char* env = std::getenv("SERVAL_LOG_LEVEL");
  spdlog::set_level(env ? spdlog::level::from_str(env) : fallback);
}

}  // namespace serval::log
