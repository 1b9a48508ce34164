// Wire format of the node-0 control channel: typed frames with a checked length, and the
// payload codecs of the rendezvous messages. Every decoder validates lengths and throws
// DistError on malformed input; none trusts a length it has not checked against a bound.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace serval::dist {

inline constexpr uint32_t kProtocolVersion = 1;
// Frame header: magic u32, type u32, payload length u32, all little-endian, then the payload.
inline constexpr uint32_t kFrameMagic = 0x4c565253;  // bytes "SRVL"
inline constexpr size_t kFrameHeaderBytes = 12;
inline constexpr size_t kUniqueIdBytes = 128;  // sizeof(ncclUniqueId)
inline constexpr size_t kMaxPlanBytes = size_t{64} << 20;
inline constexpr size_t kMaxTextBytes = 4096;
inline constexpr size_t kMaxHostnameBytes = 255;

// An opaque blob node 0 hands to every node (the NCCL unique id).
using UniqueId = std::array<uint8_t, kUniqueIdBytes>;

enum class MsgType : uint32_t {
  kHello = 1,      // node r -> node 0: Hello payload
  kWelcome = 2,    // node 0 -> node r: the UniqueId, exactly kUniqueIdBytes
  kReject = 3,     // node 0 -> node r: why the rendezvous failed (text)
  kPlan = 4,       // node 0 -> node r: one per-step plan, opaque bytes
  kHeartbeat = 5,  // both ways, empty
  kShutdown = 6,   // node 0 -> node r: clean end of the session, empty
  kAbort = 7,      // node 0 -> node r: the group broke (a peer was lost), text
};
const char* msg_type_name(MsgType t);

struct Frame {
  MsgType type = MsgType::kHeartbeat;
  std::vector<uint8_t> payload;
};

// Header + payload. Throws DistError if the payload exceeds the bound of its type.
std::vector<uint8_t> encode_frame(MsgType type, std::span<const uint8_t> payload = {});
std::vector<uint8_t> encode_text_frame(MsgType type, std::string_view text);

// Incremental parser over a byte stream cut at arbitrary points. A malformed header (bad magic,
// unknown type, payload length over its type's bound or not the fixed size) throws DistError
// as soon as the header is complete, before any payload is buffered; the reader then stays
// failed and every later call throws again.
class FrameReader {
 public:
  void feed(std::span<const uint8_t> bytes);
  std::optional<Frame> next();
  size_t buffered_bytes() const { return buf_.size() - pos_; }

 private:
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;  // start of the first unparsed byte
  std::string error_;
};

struct Hello {
  uint32_t protocol_version = kProtocolVersion;
  int32_t node_rank = 0, nnodes = 1;
  uint64_t config_hash = 0;
  std::string hostname;  // at most kMaxHostnameBytes
};
// Layout: version u32, node_rank i32, nnodes i32, config_hash u64, hostname length u16,
// hostname bytes. decode_hello throws DistError on a wrong total length or a protocol version
// other than kProtocolVersion (checked first, so a future layout is reported as a version
// mismatch rather than as garbage).
std::vector<uint8_t> encode_hello(const Hello& h);
Hello decode_hello(std::span<const uint8_t> payload);

std::string decode_text(std::span<const uint8_t> payload);
UniqueId decode_unique_id(std::span<const uint8_t> payload);

}  // namespace serval::dist
