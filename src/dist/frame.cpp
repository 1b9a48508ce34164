#include "dist/frame.h"

#include <fmt/format.h>

#include "dist/dist_error.h"

namespace serval::dist {
namespace {

constexpr size_t kHelloFixedBytes = 4 + 4 + 4 + 8 + 2;

void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

bool known_type(uint32_t t) {
  return t >= 1 && t <= 7;
}

// Inclusive payload length bounds of a type.
std::pair<size_t, size_t> payload_bounds(MsgType t) {
  switch (t) {
    case MsgType::kHello:
      return {kHelloFixedBytes, kHelloFixedBytes + kMaxHostnameBytes};
    case MsgType::kWelcome:
      return {kUniqueIdBytes, kUniqueIdBytes};
    case MsgType::kReject:
    case MsgType::kAbort:
      return {0, kMaxTextBytes};
    case MsgType::kPlan:
      return {0, kMaxPlanBytes};
    case MsgType::kHeartbeat:
    case MsgType::kShutdown:
      return {0, 0};
  }
  return {0, 0};
}

void check_payload(MsgType t, size_t len) {
  auto [lo, hi] = payload_bounds(t);
  if (len < lo || len > hi)
    throw DistError(fmt::format("{} frame with a {}-byte payload (allowed {}..{} bytes)",
                                msg_type_name(t), len, lo, hi));
}

}  // namespace

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kHello:
      return "hello";
    case MsgType::kWelcome:
      return "welcome";
    case MsgType::kReject:
      return "reject";
    case MsgType::kPlan:
      return "plan";
    case MsgType::kHeartbeat:
      return "heartbeat";
    case MsgType::kShutdown:
      return "shutdown";
    case MsgType::kAbort:
      return "abort";
  }
  return "unknown";
}

std::vector<uint8_t> encode_frame(MsgType type, std::span<const uint8_t> payload) {
  check_payload(type, payload.size());
  std::vector<uint8_t> out;
  out.reserve(kFrameHeaderBytes + payload.size());
  put_le(out, kFrameMagic, 4);
  put_le(out, static_cast<uint32_t>(type), 4);
  put_le(out, payload.size(), 4);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> encode_text_frame(MsgType type, std::string_view text) {
  // Truncated rather than refused: an error message must always get through.
  text = text.substr(0, kMaxTextBytes);
  return encode_frame(type, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

void FrameReader::feed(std::span<const uint8_t> bytes) {
  if (!error_.empty()) throw DistError(error_);
  if (pos_ > 0 && pos_ * 2 >= buf_.size()) {  // compact: amortized O(1) per byte
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<ptrdiff_t>(pos_));
    pos_ = 0;
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

std::optional<Frame> FrameReader::next() {
  if (!error_.empty()) throw DistError(error_);
  if (buffered_bytes() < kFrameHeaderBytes) return std::nullopt;
  const uint8_t* h = buf_.data() + pos_;
  uint32_t magic = static_cast<uint32_t>(get_le(h, 4));
  uint32_t type = static_cast<uint32_t>(get_le(h + 4, 4));
  size_t len = static_cast<size_t>(get_le(h + 8, 4));
  try {
    if (magic != kFrameMagic)
      throw DistError(
          fmt::format("bad frame magic 0x{:08x} (expected 0x{:08x}): not a serval "
                      "peer or a corrupted stream",
                      magic, kFrameMagic));
    if (!known_type(type)) throw DistError(fmt::format("unknown frame type {}", type));
    check_payload(static_cast<MsgType>(type), len);
  } catch (const DistError& e) {
    error_ = e.what();
    throw;
  }
  if (buffered_bytes() < kFrameHeaderBytes + len) return std::nullopt;
  Frame f;
  f.type = static_cast<MsgType>(type);
  auto start = buf_.begin() + static_cast<ptrdiff_t>(pos_ + kFrameHeaderBytes);
  f.payload.assign(start, start + static_cast<ptrdiff_t>(len));
  pos_ += kFrameHeaderBytes + len;
  if (pos_ == buf_.size()) buf_.clear(), pos_ = 0;
  return f;
}

std::vector<uint8_t> encode_hello(const Hello& h) {
  if (h.hostname.size() > kMaxHostnameBytes)
    throw DistError(
        fmt::format("hostname '{}' longer than {} bytes", h.hostname, kMaxHostnameBytes));
  std::vector<uint8_t> out;
  put_le(out, h.protocol_version, 4);
  put_le(out, static_cast<uint32_t>(h.node_rank), 4);
  put_le(out, static_cast<uint32_t>(h.nnodes), 4);
  put_le(out, h.config_hash, 8);
  put_le(out, h.hostname.size(), 2);
  out.insert(out.end(), h.hostname.begin(), h.hostname.end());
  return out;
}

Hello decode_hello(std::span<const uint8_t> p) {
  if (p.size() < 4) throw DistError(fmt::format("hello payload of {} bytes", p.size()));
  Hello h;
  h.protocol_version = static_cast<uint32_t>(get_le(p.data(), 4));
  if (h.protocol_version != kProtocolVersion)
    throw DistError(
        fmt::format("protocol version {} (this build speaks {}): run the same serval "
                    "build on every node",
                    h.protocol_version, kProtocolVersion));
  if (p.size() < kHelloFixedBytes)
    throw DistError(
        fmt::format("hello payload of {} bytes, need at least {}", p.size(), kHelloFixedBytes));
  h.node_rank = static_cast<int32_t>(get_le(p.data() + 4, 4));
  h.nnodes = static_cast<int32_t>(get_le(p.data() + 8, 4));
  h.config_hash = get_le(p.data() + 12, 8);
  size_t name_len = static_cast<size_t>(get_le(p.data() + 20, 2));
  if (p.size() != kHelloFixedBytes + name_len)
    throw DistError(fmt::format("hello payload of {} bytes, but its hostname length {} implies {}",
                                p.size(), name_len, kHelloFixedBytes + name_len));
  h.hostname.assign(p.begin() + kHelloFixedBytes, p.end());
  return h;
}

std::string decode_text(std::span<const uint8_t> p) {
  if (p.size() > kMaxTextBytes)
    throw DistError(fmt::format("text payload of {} bytes (max {})", p.size(), kMaxTextBytes));
  return std::string(p.begin(), p.end());
}

UniqueId decode_unique_id(std::span<const uint8_t> p) {
  if (p.size() != kUniqueIdBytes)
    throw DistError(fmt::format("unique id of {} bytes, expected {}", p.size(), kUniqueIdBytes));
  UniqueId id;
  std::copy(p.begin(), p.end(), id.begin());
  return id;
}

}  // namespace serval::dist
