#include "base/error.h"

#include <fmt/format.h>

namespace serval {

void fail_check(const char* expr, const std::string& msg, std::source_location loc) {
  throw Error(fmt::format("internal error: check '{}' failed at {}:{} ({}){}{}", expr,
                          loc.file_name(), loc.line(), loc.function_name(), msg.empty() ? "" : ": ",
                          msg));
}

}  // namespace serval
