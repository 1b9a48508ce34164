// `serve --config FILE` (vLLM's): a YAML mapping of flag names to values, read into flags.
//   port: 8001                    → --port 8001
//   tensor_parallel_size: 2       → --tensor-parallel-size 2  (underscores become dashes)
//   enable-prefix-caching: false  → --no-enable-prefix-caching (true: --enable-prefix-caching)
//   served-model-name: [a, b]     → --served-model-name a b
//   hf-overrides: {x: 1}          → --hf-overrides '{"x":1}'  (a mapping as its JSON)
//   model: /models/m              → --model /models/m
// Booleans and numbers are YAML 1.1's, as PyYAML reads them (true/false/yes/no/on/off).
#pragma once
#include <string>
#include <vector>

namespace serval::server {

// The flags of a config file, one group per key ({"--port", "8001"}), in the file's order.
// Throws InvalidArgument naming the file (and line) when it cannot be read, is not YAML, or is
// not a mapping of names to scalars, lists of scalars or mappings; a false boolean whose flag
// has no --no- form is left out (`no_form` says which flags have one).
std::vector<std::vector<std::string>> config_file_flags(const std::string& path,
                                                        bool (*no_form)(const std::string& flag));

}  // namespace serval::server
