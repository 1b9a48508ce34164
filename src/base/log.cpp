#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string_view>

namespace serval::log {

void init(spdlog::level::level_enum fallback) {
  auto logger = spdlog::stderr_color_mt("serval");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  const char* env = std::getenv("SERVAL_LOG_LEVEL");
  // from_str maps an unknown name to `off`: a typo would silence every error.
  const spdlog::level::level_enum level = env ? spdlog::level::from_str(env) : fallback;
  const bool known =
      env == nullptr || level != spdlog::level::off || std::string_view(env) == "off";
  spdlog::set_level(known ? level : fallback);
  if (!known)
    spdlog::warn(
        "SERVAL_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, critical, off): "
        "using {}",
        env, spdlog::level::to_string_view(fallback));
}

}  // namespace serval::log
