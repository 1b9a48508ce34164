// Malformed and malicious checkpoints: each must be refused with a LoadError that names the
// file (and the tensor where one is involved), never a crash or an out-of-bounds read.
#include <gtest/gtest.h>

#include "base/error.h"
#include "io/safetensors.h"
#include "support/expect_error.h"
#include "unit/io/safetensors_writer.h"

namespace serval::io {
namespace {

using testing::pattern;
using testing::raw_file;
using testing::safetensors_bytes;
using testing::TempDir;
using testing::TensorSpec;
using testing::write_file;

using serval::testing::expect_load_error;

class Hostile : public ::testing::Test {
 protected:
  // Writes `bytes` as bad.safetensors and expects open() to fail naming the file and `needles`.
  void expect_refused(const std::vector<uint8_t>& bytes, std::vector<std::string> needles) {
    std::string path = (dir_ / "bad.safetensors").string();
    write_file(path, bytes);
    needles.push_back(path);
    expect_load_error([&] { SafetensorsFile::open(path); }, needles);
  }
  // A header + data where the data section has `data_bytes` bytes.
  void expect_header_refused(const std::string& header, size_t data_bytes,
                             std::vector<std::string> needles) {
    expect_refused(raw_file(header, pattern(data_bytes, 1)), std::move(needles));
  }
  TempDir dir_;
};

TEST_F(Hostile, TruncatedAtEveryByte) {
  auto good = safetensors_bytes({{"first.weight", "F32", {2, 3}, pattern(24, 1)},
                                 {"last.weight", "BF16", {5}, pattern(10, 2)}},
                                {{"format", "pt"}});
  const size_t header_end = 8 + (size_t(good[0]) | size_t(good[1]) << 8);
  for (size_t cut = 0; cut < good.size(); ++cut) {
    SCOPED_TRACE("cut at byte " + std::to_string(cut));
    std::vector<std::string> needles;
    // Cut inside the data: a tensor that no longer fits is named (checked in name order,
    // first.weight holds data bytes [0, 24), last.weight [24, 34)).
    if (cut >= header_end)
      needles.push_back(cut < header_end + 24 ? "first.weight" : "last.weight");
    expect_refused(std::vector<uint8_t>(good.begin(), good.begin() + ptrdiff_t(cut)), needles);
  }
}

TEST_F(Hostile, HeaderLengthHuge) {
  expect_refused(raw_file(uint64_t(1) << 63, "{}", {}), {"header length"});
  expect_refused(raw_file(~uint64_t(0), "{}", {}), {"header length"});
  expect_refused(raw_file(SafetensorsFile::kMaxHeaderBytes + 1, "{}", {}), {"limit"});
}

TEST_F(Hostile, HeaderLengthPastEndOfFile) {
  expect_refused(raw_file(100, "{}", {}), {"header length 100", "end of the file"});
}

TEST_F(Hostile, HeaderNotJsonOrNotObject) {
  expect_header_refused("{\"a\": ", 0, {"invalid JSON"});
  expect_header_refused("\xff\xfe{}", 0, {"invalid JSON"});
  expect_header_refused("", 0, {"invalid JSON"});
  // nlohmann reports this one as out_of_range, not parse_error (found by the fuzz test).
  expect_header_refused(R"({"t": {"dtype": "U8", "shape": [1e2995], "data_offsets": [0, 0]}})", 0,
                        {"invalid JSON", "overflow"});
  expect_header_refused("[1, 2]", 0, {"must be a JSON object", "array"});
  expect_header_refused("\"str\"", 0, {"must be a JSON object"});
  expect_header_refused(std::string(5000, '[') + std::string(5000, ']'), 0, {"nests deeper"});
}

TEST_F(Hostile, UnknownDtype) {
  expect_header_refused(R"({"t.w": {"dtype": "F17", "shape": [1], "data_offsets": [0, 2]}})", 2,
                        {"t.w", "unknown dtype 'F17'"});
  expect_header_refused(R"({"t.w": {"dtype": 5, "shape": [1], "data_offsets": [0, 2]}})", 2,
                        {"t.w", "dtype"});
  expect_header_refused(R"({"t.w": {"shape": [1], "data_offsets": [0, 2]}})", 2, {"t.w", "dtype"});
}

TEST_F(Hostile, DtypeTimesShapeDiffersFromByteLength) {
  expect_header_refused(R"({"t.w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
                        24, {"t.w", "F32", "20 bytes"});
  expect_header_refused(R"({"t.w": {"dtype": "BF16", "shape": [], "data_offsets": [0, 4]}})", 4,
                        {"t.w"});
  // Element count times 4 bytes overflows 64 bits.
  expect_header_refused(
      R"({"t.w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})", 0,
      {"t.w"});
  // The element count itself overflows.
  expect_header_refused(
      R"({"t.w": {"dtype": "U8", "shape": [4294967296, 4294967296, 2], "data_offsets": [0, 0]}})",
      0, {"t.w", "too many elements"});
}

TEST_F(Hostile, BadShapes) {
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}})", 0,
                        {"t.w", "-1"});
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]}})", 1,
                        {"t.w", "shape"});
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": 4, "data_offsets": [0, 4]}})", 4,
                        {"t.w", "shape"});
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": ["4"], "data_offsets": [0, 4]}})", 4,
                        {"t.w", "shape"});
}

TEST_F(Hostile, BadDataOffsets) {
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", 7,
                        {"t.w", "ends at byte 8", "7 data bytes"});
  expect_header_refused(
      R"({"t.w": {"dtype": "U8", "shape": [1], "data_offsets": [18446744073709551615, 1]}})", 8,
      {"t.w", "data_offsets"});
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": [0], "data_offsets": [5, 4]}})", 8,
                        {"t.w", "begin 5 > end 4"});
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", 8,
                        {"t.w", "data_offsets"});
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})", 8,
                        {"t.w", "data_offsets"});
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1]}})", 8,
                        {"t.w", "data_offsets"});
  expect_header_refused(R"({"t.w": {"dtype": "U8", "shape": [1]}})", 8, {"t.w", "data_offsets"});
  expect_header_refused(R"({"t.w": [1, 2]})", 8, {"t.w", "must be an object"});
}

TEST_F(Hostile, OverlappingRanges) {
  expect_header_refused(R"({"a.w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                            "b.w": {"dtype": "U8", "shape": [4], "data_offsets": [3, 7]}})",
                        8, {"a.w", "b.w", "overlap"});
  // Same range twice.
  expect_header_refused(R"({"a.w": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
                            "b.w": {"dtype": "I32", "shape": [1], "data_offsets": [2, 6]}})",
                        8, {"a.w", "b.w", "overlap"});
  // One range inside a third, with a clean one in between in name order.
  expect_header_refused(R"({"a.w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                            "m.w": {"dtype": "U8", "shape": [0], "data_offsets": [3, 3]},
                            "z.w": {"dtype": "U8", "shape": [2], "data_offsets": [5, 7]}})",
                        8, {"a.w", "z.w", "overlap"});
}

TEST_F(Hostile, EmptyTensorsMayShareOffsets) {
  std::string path = (dir_ / "ok.safetensors").string();
  write_file(path, raw_file(R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]},
                                "b": {"dtype": "F32", "shape": [0, 4], "data_offsets": [2, 2]},
                                "c": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})",
                            pattern(3, 1)));
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->find("c")->data[0], pattern(3, 1)[1]);
}

TEST_F(Hostile, MetadataMustHoldStrings) {
  expect_header_refused(R"({"__metadata__": {"format": 1}})", 0, {"__metadata__", "format"});
  expect_header_refused(R"({"__metadata__": ["pt"]})", 0, {"__metadata__"});
}

TEST_F(Hostile, NonRegularOrMissingFile) {
  expect_load_error([&] { SafetensorsFile::open(dir_.str()); }, {dir_.str()});
  std::string absent = (dir_ / "absent.safetensors").string();
  expect_load_error([&] { SafetensorsFile::open(absent); }, {absent});
}

// --- sharded index ---

class HostileIndex : public Hostile {
 protected:
  void SetUp() override {
    write_file(dir_ / "s1.safetensors", safetensors_bytes({{"a", "U8", {2}, {1, 2}}}));
    write_file(dir_ / "s2.safetensors", safetensors_bytes({{"b", "U8", {1}, {3}}}));
  }
  void expect_index_refused(const std::string& index_text, std::vector<std::string> needles) {
    std::string index = (dir_ / "model.safetensors.index.json").string();
    write_file(index, index_text);
    needles.push_back(index);
    expect_load_error([&] { Checkpoint::open(dir_.str()); }, needles);
  }
};

TEST_F(HostileIndex, ValidIndexOpens) {
  write_file(dir_ / "model.safetensors.index.json",
             std::string(R"({"weight_map": {"a": "s1.safetensors", "b": "./s2.safetensors"}})"));
  auto ck = Checkpoint::open(dir_.str());
  EXPECT_EQ(ck->get("b").data[0], 3);
}

TEST_F(HostileIndex, MissingShard) {
  expect_index_refused(R"({"weight_map": {"a": "s1.safetensors", "b": "s9.safetensors"}})",
                       {"'b'", "s9.safetensors", "does not exist"});
}

TEST_F(HostileIndex, PathTraversal) {
  expect_index_refused(R"({"weight_map": {"a": "../etc/passwd"}})", {"'a'", "../etc/passwd"});
  expect_index_refused(R"({"weight_map": {"a": "sub/../../s1.safetensors"}})", {"'a'"});
  expect_index_refused(R"({"weight_map": {"a": "/etc/passwd"}})", {"'a'", "/etc/passwd"});
  expect_index_refused(R"({"weight_map": {"a": ""}})", {"'a'"});
}

TEST_F(HostileIndex, TensorMissingFromItsShard) {
  expect_index_refused(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})",
                       {"'b'", "s1.safetensors", "does not hold"});
}

TEST_F(HostileIndex, MalformedIndex) {
  expect_index_refused(R"({"weight_map": )", {"invalid JSON"});
  expect_index_refused(R"({"metadata": {}})", {"weight_map", "missing"});
  expect_index_refused(R"({"weight_map": ["a"]})", {"weight_map"});
  expect_index_refused(R"({"weight_map": {}})", {"weight_map"});
  expect_index_refused(R"({"weight_map": {"a": 1}})", {"'a'", "string"});
  expect_index_refused(R"([])", {"object"});
}

TEST_F(HostileIndex, BrokenShardNamesShardFile) {
  write_file(dir_ / "s2.safetensors", raw_file(1000, "{}", {}));
  expect_load_error(
      [&] {
        write_file(
            dir_ / "model.safetensors.index.json",
            std::string(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})"));
        Checkpoint::open(dir_.str());
      },
      {(dir_ / "s2.safetensors").string(), "header length"});
}

}  // namespace
}  // namespace serval::io
