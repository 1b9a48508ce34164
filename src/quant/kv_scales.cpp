#include "quant/kv_scales.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "base/error.h"

namespace serval::quant {
namespace {

enum class Which { kK, kV, kBoth };

struct Accepted {
  std::string_view suffix;  // after "<layer prefix>."
  Which which;
};

constexpr Accepted kAccepted[] = {
    {"self_attn.k_proj.k_scale", Which::kK},
    {"self_attn.v_proj.v_scale", Which::kV},
    {"self_attn.qkv_proj.k_scale", Which::kK},
    {"self_attn.qkv_proj.v_scale", Which::kV},
    {"self_attn.k_scale", Which::kK},
    {"self_attn.v_scale", Which::kV},
    {"self_attn.attn.k_scale", Which::kK},
    {"self_attn.attn.v_scale", Which::kV},
    {"mixer.k_proj.k_scale", Which::kK},
    {"mixer.v_proj.v_scale", Which::kV},
    {"self_attn.k_proj.output_scale", Which::kK},
    {"self_attn.v_proj.output_scale", Which::kV},
    {"mixer.k_proj.output_scale", Which::kK},
    {"mixer.v_proj.output_scale", Which::kV},
    {"self_attn.kv_scale", Which::kBoth},
    {"self_attn.attn.kv_scale", Which::kBoth},
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Layer index of `name` under `pattern` ("A{i}B") and the rest after "A<i>B.", or nullopt.
std::optional<std::pair<long, std::string_view>> split_layer(std::string_view name,
                                                             std::string_view head,
                                                             std::string_view tail) {
  if (name.substr(0, head.size()) != head) return std::nullopt;
  size_t pos = head.size(), digits = 0;
  while (pos + digits < name.size() && std::isdigit(static_cast<unsigned char>(name[pos + digits])))
    ++digits;
  if (digits == 0 || digits > 9 || (digits > 1 && name[pos] == '0')) return std::nullopt;
  long layer = std::stol(std::string(name.substr(pos, digits)));
  pos += digits;
  if (name.substr(pos, tail.size()) != tail) return std::nullopt;
  pos += tail.size();
  if (pos >= name.size() || name[pos] != '.') return std::nullopt;
  return std::make_pair(layer, name.substr(pos + 1));
}

std::string accepted_list(const std::string& pattern) {
  std::string s;
  for (const Accepted& a : kAccepted)
    s += (s.empty() ? "" : ", ") + pattern + "." + std::string(a.suffix);
  return s;
}

struct Slot {
  std::optional<float> value;
  std::string from;  // tensor that set it
};

void assign(Slot& slot, float value, const std::string& name, long layer, const char* kv) {
  if (slot.value && *slot.value != value)
    throw LoadError(
        fmt::format("KV-cache {} scale of layer {} is given twice with different "
                    "values: '{}' = {} and '{}' = {}",
                    kv, layer, slot.from, *slot.value, name, value));
  if (!slot.value) slot = Slot{value, name};
}

}  // namespace

bool is_kv_scale_name(std::string_view name) {
  size_t dot = name.rfind('.');
  std::string_view last = dot == std::string_view::npos ? name : name.substr(dot + 1);
  if (last == "k_scale" || last == "v_scale" || last == "kv_scale") return true;
  return name == "k_proj.output_scale" || name == "v_proj.output_scale" ||
         ends_with(name, ".k_proj.output_scale") || ends_with(name, ".v_proj.output_scale");
}

KvScales load_kv_scales(std::span<const std::string> names, const KvScaleOptions& o,
                        const TensorReader& read) {
  size_t brace = o.layer_pattern.find("{i}");
  if (brace == std::string::npos || o.layer_pattern.find("{i}", brace + 1) != std::string::npos)
    throw InvalidArgument(
        fmt::format("layer pattern '{}' must contain {{i}} exactly once", o.layer_pattern));
  if (o.num_layers < 0 ||
      (!o.attention_layers.empty() && int(o.attention_layers.size()) != o.num_layers))
    throw InvalidArgument(fmt::format("load_kv_scales: {} layers but {} attention flags",
                                      o.num_layers, o.attention_layers.size()));
  std::string_view pattern(o.layer_pattern);
  std::string_view head = pattern.substr(0, brace), tail = pattern.substr(brace + 3);
  auto is_attention = [&](long i) { return o.attention_layers.empty() || o.attention_layers[i]; };

  KvScales out;
  std::vector<Slot> k(o.num_layers), v(o.num_layers);
  for (const std::string& name : names) {
    if (!is_kv_scale_name(name)) continue;
    auto split = split_layer(name, head, tail);
    const Accepted* match = nullptr;
    if (split) {
      for (const Accepted& a : kAccepted)
        if (split->second == a.suffix) match = &a;
    }
    if (!match)
      throw LoadError(
          fmt::format("tensor '{}' looks like a KV-cache scale but is not one of the "
                      "accepted names ({})",
                      name, accepted_list(o.layer_pattern)));
    long layer = split->first;
    if (layer >= o.num_layers || !is_attention(layer))
      throw LoadError(fmt::format(
          "tensor '{}' is a KV-cache scale of layer {}, but the model has "
          "{} layers{}",
          name, layer, o.num_layers, layer < o.num_layers ? " and that one has no attention" : ""));

    Tensor t = read(name);
    if (t.numel() != 1)
      throw LoadError(fmt::format("KV-cache scale '{}' must hold one value, has shape {}", name,
                                  shape_str(t.shape)));
    DType d = t.dtype;
    if (d != DType::kF32 && d != DType::kBF16 && d != DType::kF16 && d != DType::kF64)
      throw LoadError(fmt::format("KV-cache scale '{}' has dtype {}, expected a float type", name,
                                  dtype_name(d)));
    float value = load_as_float(t.data, d, 0);
    if (!std::isfinite(value) || value <= 0.0f)
      throw LoadError(
          fmt::format("KV-cache scale '{}' is {}, expected a finite value > 0", name, value));
    if (match->which != Which::kV) assign(k[layer], value, name, layer, "k");
    if (match->which != Which::kK) assign(v[layer], value, name, layer, "v");
    out.consumed.push_back(name);
  }

  out.k.assign(o.num_layers, 1.0f);
  out.v.assign(o.num_layers, 1.0f);
  int one_sided = 0;
  for (int i = 0; i < o.num_layers; ++i) {
    if (!is_attention(i)) continue;
    if (!k[i].value && !v[i].value) {
      ++out.num_default_layers;
      continue;
    }
    ++out.num_loaded_layers;
    if (!k[i].value || !v[i].value) ++one_sided;
    // SPEC 3: with only one of k/v present, both take the max of what is present.
    float only = std::max(k[i].value.value_or(0.0f), v[i].value.value_or(0.0f));
    out.k[i] = k[i].value.value_or(only);
    out.v[i] = v[i].value.value_or(only);
  }
  int num_attention = out.num_loaded_layers + out.num_default_layers;
  if (out.num_default_layers > 0)
    out.warnings.push_back(
        fmt::format("{} of {} attention layers have no KV-cache scales in the "
                    "checkpoint and use 1.0",
                    out.num_default_layers, num_attention));
  if (one_sided > 0)
    out.warnings.push_back(
        fmt::format("{} of {} attention layers have only a k or only a v "
                    "KV-cache scale; it is used for both",
                    one_sided, num_attention));
  return out;
}

}  // namespace serval::quant
