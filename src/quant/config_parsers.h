// The per-format parsers behind quant_config.h. Internal to src/quant/.
#pragma once
#include "quant/json_fields.h"
#include "quant/quant_config.h"

namespace serval::quant {

// ModelOpt keys (quant_algo, group_size, kv_cache_quant_algo, exclude_modules) in `q`.
QuantConfig parse_modelopt(const JsonFields& q);
// vLLM/DeepSeek "fp8": weight_block_size, activation_scheme, ignored_layers.
QuantConfig parse_fp8_method(const JsonFields& q);
// compressed-tensors: config_groups, ignore, kv_cache_scheme, format.
QuantConfig parse_compressed_tensors(const JsonFields& q);
// Compiles `pattern` to check it; `fields.fail(key, ...)` when it is not a valid regex.
void validate_regex(const JsonFields& fields, std::string_view key, const std::string& pattern);

}  // namespace serval::quant
