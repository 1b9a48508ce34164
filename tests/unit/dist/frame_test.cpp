// The control-channel framing: round trips across arbitrary cuts, bounds checked at the header,
// and random bytes never crash the parser.
#include "dist/frame.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "dist/dist_error.h"

namespace serval::dist {
namespace {

std::vector<uint8_t> bytes(std::string_view s) {
  return {s.begin(), s.end()};
}

std::string error_of(FrameReader& r, std::span<const uint8_t> in) {
  try {
    r.feed(in);
    while (r.next()) {
    }
  } catch (const DistError& e) {
    return e.what();
  }
  return "";
}

TEST(Frame, RoundTripAtEveryCut) {
  UniqueId id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + 1);
  Hello h{kProtocolVersion, 3, 4, 0x0123456789abcdefULL, "gpu-node-3"};
  std::vector<std::pair<MsgType, std::vector<uint8_t>>> msgs = {
      {MsgType::kHello, encode_hello(h)},
      {MsgType::kWelcome, {id.begin(), id.end()}},
      {MsgType::kPlan, {}},
      {MsgType::kPlan, bytes("step 1: 17 tokens")},
      {MsgType::kHeartbeat, {}},
      {MsgType::kAbort, bytes("node 2 lost")},
      {MsgType::kShutdown, {}},
  };
  std::vector<uint8_t> stream;
  for (auto& [t, p] : msgs) {
    auto f = encode_frame(t, p);
    EXPECT_EQ(f.size(), kFrameHeaderBytes + p.size());
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    FrameReader r;
    std::vector<Frame> got;
    r.feed({stream.data(), cut});
    while (auto f = r.next()) got.push_back(std::move(*f));
    r.feed({stream.data() + cut, stream.size() - cut});
    while (auto f = r.next()) got.push_back(std::move(*f));
    ASSERT_EQ(got.size(), msgs.size()) << "cut " << cut;
    for (size_t i = 0; i < msgs.size(); ++i) {
      EXPECT_EQ(got[i].type, msgs[i].first) << "cut " << cut;
      EXPECT_EQ(got[i].payload, msgs[i].second) << "cut " << cut;
    }
    EXPECT_EQ(r.buffered_bytes(), 0u);
  }
  Hello back = decode_hello(msgs[0].second);
  EXPECT_EQ(back.node_rank, 3);
  EXPECT_EQ(back.nnodes, 4);
  EXPECT_EQ(back.config_hash, 0x0123456789abcdefULL);
  EXPECT_EQ(back.hostname, "gpu-node-3");
  EXPECT_EQ(decode_unique_id(msgs[1].second), id);
}

TEST(Frame, HeaderErrorsAreCaughtBeforeThePayload) {
  // Little-endian header: magic "SRVL", then type, then length.
  std::vector<uint8_t> bad_magic = {'X', 'R', 'V', 'L', 4, 0, 0, 0, 0, 0, 0, 0};
  FrameReader r1;
  EXPECT_NE(error_of(r1, bad_magic).find("bad frame magic"), std::string::npos);
  EXPECT_THROW(r1.next(), DistError);  // stays failed

  std::vector<uint8_t> bad_type = {'S', 'R', 'V', 'L', 99, 0, 0, 0, 0, 0, 0, 0};
  FrameReader r2;
  EXPECT_NE(error_of(r2, bad_type).find("unknown frame type 99"), std::string::npos);

  // A 4 GiB plan is refused from the 12-byte header alone, nothing buffered for it.
  std::vector<uint8_t> huge = {'S', 'R', 'V', 'L', 4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
  FrameReader r3;
  EXPECT_NE(error_of(r3, huge).find("plan frame with a 4294967295-byte payload"),
            std::string::npos);

  std::vector<uint8_t> short_welcome = {'S', 'R', 'V', 'L', 2, 0, 0, 0, 127, 0, 0, 0};
  FrameReader r4;
  EXPECT_NE(error_of(r4, short_welcome).find("welcome frame with a 127-byte payload"),
            std::string::npos);

  std::vector<uint8_t> fat_heartbeat = {'S', 'R', 'V', 'L', 5, 0, 0, 0, 1, 0, 0, 0};
  FrameReader r5;
  EXPECT_NE(error_of(r5, fat_heartbeat).find("heartbeat"), std::string::npos);

  EXPECT_THROW(encode_frame(MsgType::kWelcome, bytes("short")), DistError);
  EXPECT_THROW(encode_frame(MsgType::kPlan, std::vector<uint8_t>(kMaxPlanBytes + 1)), DistError);
  // Text frames truncate instead: an error message must always get through.
  EXPECT_EQ(encode_text_frame(MsgType::kReject, std::string(10000, 'x')).size(),
            kFrameHeaderBytes + kMaxTextBytes);
}

TEST(Frame, HelloValidatesLengthsAndVersion) {
  auto good = encode_hello({kProtocolVersion, 1, 2, 42, "host"});
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_THROW(decode_hello({good.data(), n}), DistError) << "truncated to " << n;
  auto longer = good;
  longer.push_back('!');
  EXPECT_THROW(decode_hello(longer), DistError);
  auto v2 = good;
  v2[0] = 2;
  try {
    decode_hello(v2);
    FAIL() << "no throw";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("protocol version 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(encode_hello({kProtocolVersion, 1, 2, 42, std::string(256, 'h')}), DistError);
}

// Random streams: the parser either yields frames that respect their type's bounds or throws
// DistError; it never crashes, hangs or yields a frame it did not fully receive.
TEST(Frame, FuzzRandomBytes) {
  std::mt19937 rng(1234);
  int errors = 0, frames = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> in(rng() % 200);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    if (iter % 2 == 0 && in.size() >= 12) {  // half start with a valid magic and a known type
      const uint8_t magic[4] = {'S', 'R', 'V', 'L'};
      std::copy(magic, magic + 4, in.begin());
      in[4] = static_cast<uint8_t>(1 + rng() % 7);
      in[5] = in[6] = in[7] = 0;
      in[10] = in[11] = 0;
      if (rng() % 2) in[9] = 0;
    }
    FrameReader r;
    size_t at = 0;
    try {
      while (at < in.size()) {
        size_t n = std::min<size_t>(in.size() - at, 1 + rng() % 17);
        r.feed({in.data() + at, n});
        at += n;
        while (auto f = r.next()) {
          ++frames;
          if (f->type == MsgType::kWelcome) {
            EXPECT_EQ(f->payload.size(), kUniqueIdBytes);
          }
          if (f->type == MsgType::kHeartbeat) {
            EXPECT_TRUE(f->payload.empty());
          }
          if (f->type == MsgType::kHello) {
            try {
              decode_hello(f->payload);
            } catch (const DistError&) {
            }
          }
        }
      }
    } catch (const DistError& e) {
      ++errors;
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  EXPECT_GT(errors, 1000);  // most random streams are refused
  EXPECT_GT(frames, 10);    // and the valid-header half does produce frames
}

TEST(Frame, FuzzMutatedValidStreams) {
  std::mt19937 rng(99);
  auto base = encode_frame(MsgType::kPlan, bytes("abcdefgh"));
  auto hello = encode_frame(MsgType::kHello, encode_hello({kProtocolVersion, 1, 3, 7, "n1"}));
  base.insert(base.end(), hello.begin(), hello.end());
  for (int iter = 0; iter < 3000; ++iter) {
    auto in = base;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k)
      in[rng() % in.size()] = static_cast<uint8_t>(rng());
    FrameReader r;
    try {
      r.feed(in);
      while (auto f = r.next()) {
        if (f->type == MsgType::kHello) {
          try {
            Hello h = decode_hello(f->payload);
            EXPECT_LE(h.hostname.size(), kMaxHostnameBytes);
          } catch (const DistError&) {
          }
        }
      }
    } catch (const DistError&) {
    }
  }
}

}  // namespace
}  // namespace serval::dist
