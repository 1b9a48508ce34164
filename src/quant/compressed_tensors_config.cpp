// compressed-tensors quantization_config (llm-compressor output) -> QuantConfig.
#include <fmt/format.h>

#include "base/error.h"
#include "quant/config_parsers.h"

namespace serval::quant {
namespace {

using Method = QuantConfig::Method;

// The parts of one config group that must agree across groups.
struct Scheme {
  Method method = Method::kNone;
  int group_size = 0;
  std::array<int, 2> block_size{0, 0};
  bool static_activations = false;
  bool weight_only = false;
  bool operator==(const Scheme&) const = default;
};

// input_activations.dynamic is true, false or "local" (NVFP4: dynamic block scales under a
// static global scale).
bool dynamic_activations(const JsonFields& a) {
  const nlohmann::json* d = a.find("dynamic");
  if (!d) return false;
  if (d->is_boolean()) return d->get<bool>();
  if (d->is_string() && d->get<std::string>() == "local") return true;
  a.fail("dynamic", "must be true, false or \"local\", got " + d->dump());
}

Scheme parse_group(const JsonFields& group) {
  Scheme s;
  JsonFields w = group.object("weights");
  std::string type = w.str("type");
  int bits = w.int_or("num_bits", 0);
  std::string strategy = w.str_or("strategy", "tensor");
  const nlohmann::json* act = group.find("input_activations");
  s.weight_only = act == nullptr;
  if (type == "float" && bits == 4) {
    if (strategy != "tensor_group" || w.int_or("group_size", 0) != 16)
      w.fail("strategy", fmt::format("4-bit float weights need strategy \"tensor_group\" with "
                                     "group_size 16 (NVFP4), got \"{}\" / {}",
                                     strategy, w.int_or("group_size", 0)));
    s.method = Method::kNvfp4;
    s.group_size = 16;
    if (act) {
      JsonFields a = group.object("input_activations");
      if (a.str_or("type", "") != "float" || a.int_or("num_bits", 0) != 4)
        a.fail("num_bits", "NVFP4 weights need 4-bit float activations or none");
      s.static_activations = true;  // input_global_scale, even with dynamic "local" blocks
    }
    return s;
  }
  if (type == "float" && bits == 8) {
    if (strategy == "tensor") {
      s.method = Method::kFp8PerTensor;
    } else if (strategy == "channel") {
      s.method = Method::kFp8PerChannel;
    } else if (strategy == "block") {
      s.method = Method::kFp8Block;
      s.block_size = w.int_pair("block_structure");
    } else {
      w.fail("strategy", fmt::format("unsupported FP8 weight strategy \"{}\" (expected tensor, "
                                     "channel or block)",
                                     strategy));
    }
    if (act) {
      JsonFields a = group.object("input_activations");
      if (a.str_or("type", "") != "float" || a.int_or("num_bits", 0) != 8)
        a.fail("num_bits", "FP8 weights need 8-bit float activations or none");
      s.static_activations = !dynamic_activations(a);
      if (s.static_activations && a.str_or("strategy", "tensor") != "tensor")
        a.fail("strategy", "static FP8 activations must use strategy \"tensor\"");
    }
    return s;
  }
  w.fail("num_bits", fmt::format("unsupported weight scheme (type \"{}\", {} bits); serval "
                                 "supports 4-bit float (NVFP4) and 8-bit float (FP8)",
                                 type, bits));
}

}  // namespace

QuantConfig parse_compressed_tensors(const JsonFields& q) {
  QuantConfig c;
  c.source = q.path();
  c.vllm_name = "compressed-tensors";
  JsonFields groups = q.object("config_groups");
  if (groups.json().empty()) q.fail("config_groups", "has no groups");
  bool all_linear = false;
  std::string first_name;
  Scheme scheme;
  for (const auto& [name, value] : groups.json().items()) {
    JsonFields group = groups.object(name);
    Scheme s = parse_group(group);
    if (first_name.empty()) {
      first_name = name, scheme = s;
    } else if (!(s == scheme)) {
      groups.fail(name, fmt::format("uses a different scheme than group \"{}\"; serval supports "
                                    "one scheme per checkpoint",
                                    first_name));
    }
    std::vector<std::string> targets = group.strings("targets");
    if (targets.empty()) group.fail("targets", "missing or empty");
    for (const std::string& t : targets) {
      if (t == "Linear") {
        all_linear = true;
      } else if (t.rfind("re:", 0) == 0) {
        validate_regex(group, "targets", t.substr(3));
        c.target_regexes.push_back(t.substr(3));
      } else {
        c.target_names.push_back(t);
      }
    }
  }
  if (all_linear) c.target_names.clear(), c.target_regexes.clear();
  c.method = scheme.method;
  c.group_size = scheme.group_size;
  c.block_size = scheme.block_size;
  c.static_activations = scheme.static_activations;
  c.weight_only = scheme.weight_only;
  c.reciprocal_global_scales = c.method == Method::kNvfp4;
  if (c.method == Method::kFp8Block) c.block_scale_name = "weight_scale";

  std::string format = q.str_or("format", "");
  bool nvfp4 = c.method == Method::kNvfp4;
  bool format_ok = format.empty() || (nvfp4 && format == "nvfp4-pack-quantized") ||
                   (!nvfp4 && (format == "float-quantized" || format == "naive-quantized"));
  if (!format_ok)
    q.fail("format", fmt::format("\"{}\" does not hold {} weights in a form serval loads", format,
                                 method_name(c.method)));

  for (const std::string& entry : q.strings("ignore")) {
    if (entry.rfind("re:", 0) == 0) {
      validate_regex(q, "ignore", entry.substr(3));
      c.exclude_regexes.push_back(entry.substr(3));
    } else {
      c.exclude_names.push_back(entry);
    }
  }

  if (q.has("kv_cache_scheme")) {
    JsonFields kv = q.object("kv_cache_scheme");
    if (kv.str_or("type", "") != "float" || kv.int_or("num_bits", 0) != 8)
      kv.fail("num_bits", "serval supports only an 8-bit float (FP8) KV cache scheme");
    c.kv_cache_fp8 = true;
  }
  return c;
}

}  // namespace serval::quant
