#include "runtime/guided_output.h"

#include "runtime/guided_vocab.h"

namespace serval::runtime {

namespace {

std::variant<JsonMatcher, GbnfMatcher> matcher_for(const JsonGrammar& grammar, bool compact) {
  if (grammar.output() == JsonGrammar::Output::kGrammar) return GbnfMatcher(grammar.gbnf());
  return JsonMatcher(grammar, compact);
}

}  // namespace

OutputMatcher::OutputMatcher(const JsonGrammar& grammar, bool compact)
    : matcher_(matcher_for(grammar, compact)) {}

void OutputMatcher::trim() {
  if (auto* gbnf = std::get_if<GbnfMatcher>(&matcher_)) gbnf->trim();
}

bool GuidedOutput::feed(std::string_view text) {
  if (!waiting_) {
    const bool fits = matcher_.feed(text);
    matcher_.trim();  // no copy is alive between tokens
    return fits;
  }
  constexpr std::string_view kThinkEnd = "</think>";
  tail_ += text;
  const size_t end = tail_.find(kThinkEnd);
  if (end == std::string::npos) {
    if (tail_.size() >= kThinkEnd.size()) tail_.erase(0, tail_.size() - (kThinkEnd.size() - 1));
    return true;
  }
  waiting_ = false;
  OutputMatcher started = matcher_;
  const bool fits = started.feed(std::string_view(tail_).substr(end + kThinkEnd.size()));
  if (fits) matcher_ = started;
  tail_.clear();
  return fits;
}

void GuidedOutput::allow_next(const GuidedVocab& vocab, std::vector<uint8_t>& allowed) {
  const auto* json = matcher_.json();
  if (!json) return vocab.allow_accepted(matcher_, allowed);
  for (const RememberedMask& r : json_masks_)
    if (r.state == *json) return vocab.unpack(r.bits, allowed);
  std::vector<uint8_t> walked(allowed.size(), 0);
  vocab.allow_accepted(*json, walked);
  if (json_masks_.size() == kRememberedJsonMasks) json_masks_.erase(json_masks_.begin());
  json_masks_.push_back({*json, vocab.pack(walked)});
  vocab.unpack(json_masks_.back().bits, allowed);
}

}  // namespace serval::runtime
