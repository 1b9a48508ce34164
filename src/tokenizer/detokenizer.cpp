// IncrementalDetokenizer: emits the part of decode(window) that no later id can
// change, decoding only a short window of recent ids.
//
// decode() is used as a black box. Later ids change text decoded earlier in
// only these ways (ByteLevel, ByteFallback, Metaspace, Strip, ... decoders):
//  * a trailing incomplete UTF-8 prefix (a lead byte and fewer continuation
//    bytes than it needs) renders as U+FFFD until a later byte completes it;
//  * ByteFallback renders a run of <0xNN> tokens as its text only when the
//    whole run is valid UTF-8, else as one U+FFFD per byte, so one later
//    invalid byte rewrites a valid run;
//  * SentencePiece decoders strip the leading space of the first token.
// The first two are found by decoding the window followed by "probe"
// continuations: continuation bytes that complete every possible prefix, and a
// never-valid byte. The text that the window and all its probes agree on is
// final. Bytes that cannot become valid (a stray continuation byte, a lead
// byte followed by a non-continuation byte, 0xC0, 0xF5..0xFF) are final and
// stream out as the U+FFFD decode() gives them.
//
// The third is handled by context: after shrink() drops leading ids, the
// window starts with a few already-emitted ids whose text is non-empty, and
// only the text after them is new. shrink() keeps the fewest context ids for
// which the short window, alone and followed by every probe, decodes to the
// same text after the context as the long window does.
#include <algorithm>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace serval::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
// shrink() runs when the window has grown by this many ids since it last
// succeeded; its cost (a few decodes per probe) is spread over these ids.
constexpr size_t kShrinkEvery = 8;

// Id of the token that decodes to byte `b`: SentencePiece byte-fallback
// spelling <0xNN>, or the GPT-2 byte-level character.
std::optional<int32_t> byte_id(const Tokenizer& tok, unsigned b, bool fallback) {
  if (fallback) return tok.token_to_id(fmt::format("<0x{:02X}>", b));
  return tok.token_to_id(byte_to_unicode(static_cast<unsigned char>(b)));
}

// Id of the first byte in `ranges` (inclusive) that has a token.
std::optional<int32_t> first_byte_id(const Tokenizer& tok, bool fallback,
                                     std::initializer_list<std::pair<unsigned, unsigned>> ranges) {
  for (auto [lo, hi] : ranges)
    for (unsigned b = lo; b <= hi; ++b)
      if (auto id = byte_id(tok, b, fallback)) return id;
  return std::nullopt;
}

size_t common_prefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Rounds `n` down to a character boundary of the valid UTF-8 string `s`.
size_t char_floor(std::string_view s, size_t n) {
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens), shrink_at_(kShrinkEvery) {
  // Which spelling of byte tokens does the decoder join into UTF-8 (C3 A9 = é)?
  for (bool fallback : {true, false}) {
    const auto c3 = byte_id(tok, 0xC3, fallback), a9 = byte_id(tok, 0xA9, fallback);
    if (!c3 || !a9) continue;
    const int32_t e_acute[] = {*c3, *a9};
    if (tok.decode(e_acute, false) != "\xC3\xA9") continue;

    // A byte that makes a run invalid: one that is never valid, else a
    // continuation byte (invalid after a complete character; after an
    // incomplete prefix the run already renders as U+FFFD and is held back
    // by the completion probes).
    const int32_t bad = first_byte_id(tok, fallback, {{0xF5, 0xFF}, {0xC0, 0xC1}}).value_or(*a9);
    const int32_t run[] = {*c3, *a9, bad};
    byte_runs_ = tok.decode(run, false) != std::string("\xC3\xA9").append(kReplacement);
    invalid_byte_ = {bad};
    if (auto ascii = first_byte_id(tok, fallback, {{0x41, 0x5A}, {0x21, 0x7E}}))
      ascii_byte_ = {*ascii};
    // Every lead byte accepts a second byte in 80..8F or in A0..BF, and any
    // continuation byte after that. Without byte runs, three bytes complete
    // any prefix (extra ones only add U+FFFD after the character); with byte
    // runs an extra byte invalidates the whole run, so each length is tried.
    const auto low = first_byte_id(tok, fallback, {{0x80, 0x8F}});
    const auto high = first_byte_id(tok, fallback, {{0xA0, 0xBF}});
    const auto any = low ? low : high;
    for (auto second : {low, high}) {
      if (!second) continue;
      for (size_t len = byte_runs_ ? 1 : 3; len <= 3; ++len) {
        std::vector<int32_t> c(len, *any);
        c[0] = *second;
        completions_.push_back(std::move(c));
      }
    }
    break;
  }
}

std::string IncrementalDetokenizer::decode_with(std::span<const int32_t> ids,
                                                std::span<const int32_t> tail) const {
  if (tail.empty()) return tok_.decode(ids, skip_special_);
  std::vector<int32_t> joined(ids.begin(), ids.end());
  joined.insert(joined.end(), tail.begin(), tail.end());
  return tok_.decode(joined, skip_special_);
}

std::vector<std::span<const int32_t>> IncrementalDetokenizer::probes(std::string_view text,
                                                                     bool all) const {
  std::vector<std::span<const int32_t>> out;
  if (byte_runs_) out.emplace_back(invalid_byte_);
  // Tells an open invalid run from a closed one (see shrink()).
  if (all && byte_runs_ && !ascii_byte_.empty()) out.emplace_back(ascii_byte_);
  // An incomplete prefix always renders as a trailing U+FFFD.
  if (all || text.ends_with(kReplacement))
    for (const auto& c : completions_) out.emplace_back(c);
  return out;
}

std::string IncrementalDetokenizer::push(int32_t id) {
  window_.push_back(id);
  std::string text;
  try {
    text = decode_with(window_, {});
  } catch (...) {
    window_.pop_back();
    throw;
  }
  if (text.compare(0, emitted_, text_, 0, emitted_) != 0) {
    // Emitted text changed: a decoder this class does not model. Nothing more
    // can be emitted consistently; finish() returns the rest.
    text_ = std::move(text);
    return {};
  }
  size_t stable = text.size();
  for (auto probe : probes(text, false))
    stable = std::min(stable, common_prefix(text, decode_with(window_, probe)));
  stable = char_floor(text, stable);
  text_ = std::move(text);
  std::string out;
  if (stable > emitted_) {
    out = text_.substr(emitted_, stable - emitted_);
    emitted_ = stable;
  }
  if (window_.size() >= shrink_at_) shrink();
  return out;
}

void IncrementalDetokenizer::shrink() {
  const size_t n = window_.size();
  shrink_at_ = 2 * n;  // unless shrinking succeeds below
  // Cut point k: the longest window prefix whose text is emitted (held-back
  // text spans at most a few trailing ids, or a whole byte-fallback run).
  size_t k = 0;
  std::string head;
  for (size_t c = n; c >= 2 && c + 4 > n; --c) {
    std::string t = tok_.decode(std::span(window_).first(c), skip_special_);
    if (t.size() <= emitted_ && text_.starts_with(t)) {
      k = c;
      head = std::move(t);
      break;
    }
  }
  if (k == 0) return;
  // Text after the cut in the current window, alone and after each probe.
  const auto qs = probes(text_, true);
  std::vector<std::string> tails{text_.substr(head.size())};
  for (auto q : qs) {
    std::string t = decode_with(window_, q);
    if (!t.starts_with(head)) return;
    tails.push_back(t.substr(head.size()));
  }
  // Candidate contexts: the last 1, 2, 4, ... emitted ids, and a synthetic
  // never-valid byte (it keeps a ByteFallback run invalid without the ids
  // that made it invalid; the ASCII byte probe rejects it where it would
  // turn later valid bytes into U+FFFD).
  std::vector<std::vector<int32_t>> contexts;
  const auto cut = window_.begin() + static_cast<std::ptrdiff_t>(k);
  contexts.emplace_back(cut - 1, cut);
  if (!invalid_byte_.empty() && (!byte_runs_ || !ascii_byte_.empty()))
    contexts.push_back(invalid_byte_);
  for (size_t c = 2; c < k; c *= 2)
    contexts.emplace_back(cut - static_cast<std::ptrdiff_t>(c), cut);
  for (auto& context : contexts) {
    const std::string ctx_text = tok_.decode(context, skip_special_);
    if (ctx_text.empty()) continue;  // the first-token space strip would move past it
    std::vector<int32_t> candidate = std::move(context);
    candidate.insert(candidate.end(), cut, window_.end());
    std::string new_text;
    bool same = true;
    for (size_t i = 0; same && i < tails.size(); ++i) {
      std::string t = decode_with(candidate, i == 0 ? std::span<const int32_t>() : qs[i - 1]);
      same = t.starts_with(ctx_text) && std::string_view(t).substr(ctx_text.size()) == tails[i];
      if (i == 0) new_text = std::move(t);
    }
    if (!same) continue;
    window_ = std::move(candidate);
    emitted_ = ctx_text.size() + (emitted_ - head.size());
    text_ = std::move(new_text);
    shrink_at_ = window_.size() + kShrinkEvery;
    return;
  }
}

std::string IncrementalDetokenizer::finish() {
  std::string rest = text_.size() > emitted_ ? text_.substr(emitted_) : std::string();
  window_.clear();
  text_.clear();
  emitted_ = 0;
  shrink_at_ = kShrinkEvery;
  return rest;
}

}  // namespace serval::tokenizer
