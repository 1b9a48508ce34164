// CLI11 validators with messages that name the bound: CLI::PositiveNumber reports
// "Value 0 not in range 0.000000 to 1.797693e+308".
#pragma once
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "quant/quant_config.h"

namespace serval::apps {

// --quantization,-q (vLLM's flag): one of the formats serval reads; the load checks it against
// the checkpoint (quant::check_requested_quantization).
inline void add_quantization_option(CLI::App* cmd, std::string& target) {
  cmd->add_option("--quantization,-q", target,
                  "The checkpoint's quantization (checked; default: read from the checkpoint)")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(quant::kQuantizationChoices),
                                                     std::end(quant::kQuantizationChoices))));
}

// The value parses as a number >= least ("must be >= 1, got 0").
inline CLI::Validator at_least(double least) {
  return CLI::Validator(
      [least](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0') return fmt::format("'{}' is not a number", s);
        return v >= least ? std::string() : fmt::format("must be >= {}, got {}", least, s);
      },
      fmt::format("NUMBER >= {}", least));
}

}  // namespace serval::apps
