// SSE parser: events must come out the same however the byte stream is split.
#include "clients/sse.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using serval::clients::SseParser;

namespace {

std::vector<std::string> parse_in_pieces(const std::string& stream, std::vector<size_t> cuts) {
  SseParser p;
  std::vector<std::string> events;
  auto on = [&](std::string_view d) { events.emplace_back(d); };
  size_t prev = 0;
  cuts.push_back(stream.size());
  for (size_t c : cuts) {
    p.feed(std::string_view(stream).substr(prev, c - prev), on);
    prev = c;
  }
  return events;
}

const std::string kStream =
    "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
    ": keep-alive comment\n\n"
    "event: message\r\ndata: {\"x\":1}\r\nid: 7\r\n\r\n"
    "data:no-space\r\rdata: line1\ndata: line2\n\n"
    "data: [DONE]\n\n";
const std::vector<std::string> kWant = {"{\"choices\":[{\"text\":\"a\"}]}", "{\"x\":1}", "no-space",
                                        "line1\nline2", "[DONE]"};

}  // namespace

TEST(Sse, WholeStream) {
  EXPECT_EQ(parse_in_pieces(kStream, {}), kWant);
}

TEST(Sse, EverySingleSplitPoint) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut)
    EXPECT_EQ(parse_in_pieces(kStream, {cut}), kWant) << "cut at " << cut;
}

TEST(Sse, EveryPairOfSplitPoints) {
  for (size_t a = 0; a <= kStream.size(); a += 3)
    for (size_t b = a; b <= kStream.size(); ++b)
      ASSERT_EQ(parse_in_pieces(kStream, {a, b}), kWant) << "cuts " << a << "," << b;
}

TEST(Sse, ByteByByte) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < kStream.size(); ++i) cuts.push_back(i);
  EXPECT_EQ(parse_in_pieces(kStream, cuts), kWant);
}

TEST(Sse, UnterminatedEventIsNotDelivered) {
  EXPECT_EQ(parse_in_pieces("data: a\n\ndata: b\n", {}), std::vector<std::string>{"a"});
}

TEST(Sse, CrLfSplitAcrossFeedsIsOneLineEnd) {
  // "\r" then "\n" in separate feeds must not make an extra blank line (which would dispatch).
  SseParser p;
  std::vector<std::string> ev;
  auto on = [&](std::string_view d) { ev.emplace_back(d); };
  p.feed("data: a\r", on);
  p.feed("\ndata: b\r", on);
  p.feed("\n\r\n", on);
  EXPECT_EQ(ev, std::vector<std::string>{"a\nb"});
}
