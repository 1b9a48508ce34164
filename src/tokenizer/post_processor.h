// Post-processors of tokenizer.json ("post_processor"): TemplateProcessing,
// ByteLevel (a no-op on ids), RobertaProcessing, BertProcessing and Sequence.
// They add the special tokens (BOS/EOS) around one encoded sequence.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::tokenizer {

// The ids that surround a single sequence when add_special_tokens is set.
struct SpecialWrap {
  std::vector<int32_t> before, after;
};

// `lookup` resolves token strings (Roberta/Bert configs name them). Throws
// LoadError on unsupported types or templates that reference unknown tokens.
SpecialWrap make_special_wrap(
    const nlohmann::json& config,
    const std::function<std::optional<int32_t>(std::string_view)>& lookup);

}  // namespace serval::tokenizer
