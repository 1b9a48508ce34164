#include "runtime/step_plan.h"

#include <fmt/format.h>

#include <cstring>
#include <string>

#include "dist/dist_error.h"

namespace serval::runtime {
namespace {

constexpr uint8_t kSetupTag = 1, kStepTag = 2;
// Largest position a chunk may reach (a bound, so a corrupt start cannot allocate gigabytes).
constexpr int64_t kMaxPlanPositions = int64_t{1} << 24;

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

void put_ints(std::vector<uint8_t>& out, std::span<const int32_t> v) {
  put_u32(out, uint32_t(v.size()));
  for (int32_t x : v) put_u32(out, uint32_t(x));
}

// Sequential reader that names the field it failed on.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint8_t u8(const char* what) {
    need(1, what);
    return bytes_[pos_++];
  }
  uint32_t u32(const char* what) {
    need(4, what);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(bytes_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return v;
  }
  std::vector<int32_t> ints(const char* what) {
    const uint32_t n = u32(what);
    if (n > remaining() / 4)
      throw dist::DistError(fmt::format("step plan: {} claims {} entries but only {} bytes remain",
                                        what, n, remaining()));
    std::vector<int32_t> v(n);
    for (uint32_t i = 0; i < n; ++i) v[i] = int32_t(u32(what));
    return v;
  }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  void need(size_t n, const char* what) {
    if (remaining() < n)
      throw dist::DistError(fmt::format("step plan: truncated at byte {} reading {}", pos_, what));
  }
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<SeqChunk> StepPlan::views() const {
  std::vector<SeqChunk> out;
  out.reserve(chunks.size());
  for (const Chunk& c : chunks)
    out.push_back({c.tokens, c.start, c.num_new, c.block_table, c.logits});
  return out;
}

std::vector<uint8_t> encode_setup_plan(const SetupPlan& setup) {
  std::vector<uint8_t> out{kSetupTag};
  put_u32(out, uint32_t(setup.num_blocks));
  return out;
}

// Layout: tag u8 = 2, chunk count u32, then per chunk: start i32, num_new i32, logits u8,
// new tokens (count u32 + i32 each: positions start .. start + num_new − 1), block table (count
// u32 + i32 each).
std::vector<uint8_t> encode_step_plan(std::span<const SeqChunk> chunks) {
  std::vector<uint8_t> out{kStepTag};
  put_u32(out, uint32_t(chunks.size()));
  for (const SeqChunk& c : chunks) {
    put_u32(out, uint32_t(c.start));
    put_u32(out, uint32_t(c.num_new));
    out.push_back(uint8_t(c.logits));
    put_ints(out, c.tokens.subspan(size_t(c.start), size_t(c.num_new)));
    put_ints(out, c.block_table);
  }
  return out;
}

std::variant<SetupPlan, StepPlan> decode_plan(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  const uint8_t tag = r.u8("message tag");
  if (tag == kSetupTag) {
    SetupPlan s;
    s.num_blocks = int32_t(r.u32("num_blocks"));
    if (s.num_blocks <= 0)
      throw dist::DistError(
          fmt::format("setup plan: num_blocks {} must be positive", s.num_blocks));
    if (r.remaining() != 0)
      throw dist::DistError(fmt::format("setup plan: {} trailing bytes", r.remaining()));
    return s;
  }
  if (tag != kStepTag) throw dist::DistError(fmt::format("plan: unknown message tag {}", tag));
  StepPlan plan;
  const uint32_t n = r.u32("chunk count");
  if (n > r.remaining())
    throw dist::DistError(fmt::format("step plan: {} chunks in {} bytes", n, r.remaining()));
  for (uint32_t i = 0; i < n; ++i) {
    StepPlan::Chunk c;
    c.start = int32_t(r.u32("start"));
    c.num_new = int32_t(r.u32("num_new"));
    const uint8_t logits = r.u8("logits mode");
    if (logits > uint8_t(SeqChunk::Logits::kAll))
      throw dist::DistError(fmt::format("step plan: chunk {} has logits mode {}", i, logits));
    c.logits = SeqChunk::Logits(logits);
    const std::vector<int32_t> fresh = r.ints("tokens");
    c.block_table = r.ints("block table");
    if (c.start < 0 || c.num_new < 0 || size_t(c.num_new) != fresh.size() ||
        int64_t(c.start) + c.num_new > kMaxPlanPositions)
      throw dist::DistError(
          fmt::format("step plan: chunk {} has start {} and num_new {} with {} new tokens", i,
                      c.start, c.num_new, fresh.size()));
    c.tokens.assign(size_t(c.start), 0);
    c.tokens.insert(c.tokens.end(), fresh.begin(), fresh.end());
    plan.chunks.push_back(std::move(c));
  }
  if (r.remaining() != 0)
    throw dist::DistError(fmt::format("step plan: {} trailing bytes", r.remaining()));
  return plan;
}

}  // namespace serval::runtime
