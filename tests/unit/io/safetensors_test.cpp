#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "base/error.h"
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

std::vector<TensorSpec> sample_tensors() {
  return {
      {"model.embed_tokens.weight", "BF16", {4, 3}, pattern(24, 1)},
      {"scale", "F32", {}, pattern(4, 2)},
      {"empty", "F16", {0, 5}, {}},
      {"w.fp8", "F8_E4M3", {2, 2, 2}, pattern(8, 3)},
      {"ids", "I64", {3}, pattern(24, 4)},
      {"mask", "BOOL", {5}, pattern(5, 5)},
      {"block_scale", "F8_E8M0", {7}, pattern(7, 6)},
      {"packed", "U8", {2, 8}, pattern(16, 7)},
  };
}

TEST(Safetensors, RoundTripsDtypesShapesAndMetadata) {
  TempDir dir;
  auto specs = sample_tensors();
  write_file(dir / "a.safetensors", safetensors_bytes(specs, {{"format", "pt"}, {"k", "v"}}));
  auto f = SafetensorsFile::open((dir / "a.safetensors").string());
  ASSERT_EQ(f->tensors().size(), specs.size());
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("k"), "v");
  const std::pair<std::string, DType> want_dtypes[] = {{"model.embed_tokens.weight", DType::kBF16},
                                                       {"scale", DType::kF32},
                                                       {"empty", DType::kF16},
                                                       {"w.fp8", DType::kF8E4M3},
                                                       {"ids", DType::kI64},
                                                       {"mask", DType::kBool},
                                                       {"block_scale", DType::kUE8M0},
                                                       {"packed", DType::kU8}};
  for (const auto& [name, dtype] : want_dtypes) {
    const TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dtype) << name;
  }
  for (const TensorSpec& s : specs) {
    const TensorInfo* t = f->find(s.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->shape, s.shape) << s.name;
    EXPECT_EQ(t->nbytes, s.bytes.size()) << s.name;
    EXPECT_EQ(t->file, (dir / "a.safetensors").string());
    EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), s.bytes) << s.name;
  }
  EXPECT_EQ(f->find("scale")->numel(), 1);
  EXPECT_EQ(f->find("empty")->numel(), 0);
  EXPECT_EQ(f->find("model.embed_tokens.weight")->numel(), 12);
  EXPECT_EQ(f->find("nope"), nullptr);
  for (size_t i = 1; i < f->tensors().size(); ++i) {
    EXPECT_LT(f->tensors()[i - 1].name, f->tensors()[i].name);
  }
  f->prefetch();
}

TEST(Safetensors, ReadsBf16ValuesBackAsFloat) {
  TempDir dir;
  std::vector<uint8_t> bytes;
  const float values[] = {1.0f, -2.5f, 0.15625f, 1024.0f};
  for (float v : values) {
    uint16_t b = float_to_bf16(v).bits;
    bytes.push_back(uint8_t(b));
    bytes.push_back(uint8_t(b >> 8));
  }
  write_file(dir / "v.safetensors", safetensors_bytes({{"x", "BF16", {2, 2}, bytes}}));
  auto f = SafetensorsFile::open((dir / "v.safetensors").string());
  const TensorInfo* t = f->find("x");
  ASSERT_NE(t, nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(load_as_float(t->data, t->dtype, i), values[i]);
}

TEST(Checkpoint, SingleFileFolder) {
  TempDir dir;
  write_file(dir / "model.safetensors", safetensors_bytes(sample_tensors()));
  // A stray file that must be ignored when model.safetensors exists.
  write_file(dir / "other.safetensors", safetensors_bytes({{"stray", "U8", {1}, {9}}}));
  auto ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck->size(), sample_tensors().size());
  EXPECT_EQ(ck->find("stray"), nullptr);
  const TensorInfo& t = ck->get("w.fp8");
  EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), pattern(8, 3));
  expect_load_error([&] { ck->get("missing.weight"); }, {"missing.weight", dir.str()});
}

TEST(Checkpoint, ShardedFolderWithIndex) {
  TempDir dir;
  write_file(
      dir / "model-00001-of-00002.safetensors",
      safetensors_bytes({{"a", "F32", {2}, pattern(8, 1)}, {"b", "BF16", {3}, pattern(6, 2)}}));
  write_file(dir / "model-00002-of-00002.safetensors",
             safetensors_bytes({{"c", "I32", {1, 2}, pattern(8, 3)}}));
  write_file(dir / "model.safetensors.index.json",
             std::string(R"({"metadata": {"total_size": 22}, "weight_map": {
               "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
               "c": "model-00002-of-00002.safetensors"}})"));
  auto ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck->files().size(), 2u);
  const TensorInfo& c = ck->get("c");
  EXPECT_EQ(c.dtype, DType::kI32);
  EXPECT_EQ(c.shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.file, (dir / "model-00002-of-00002.safetensors").string());
  EXPECT_EQ(std::vector<uint8_t>(c.data, c.data + c.nbytes), pattern(8, 3));
  EXPECT_EQ(std::vector<uint8_t>(ck->get("b").data, ck->get("b").data + 6), pattern(6, 2));
}

// Hugging Face cache snapshots hold symlinks into ../../blobs; those must keep working.
TEST(Checkpoint, ShardMayBeSymlinkOutsideFolder) {
  TempDir root;
  std::filesystem::create_directories(root / "blobs");
  std::filesystem::create_directories(root / "snapshot");
  write_file(root / "blobs" / "abc123", safetensors_bytes({{"a", "U8", {2}, {5, 6}}}));
  std::filesystem::create_symlink("../blobs/abc123", root / "snapshot" / "model-1.safetensors");
  write_file(root / "snapshot" / "model.safetensors.index.json",
             std::string(R"({"weight_map": {"a": "model-1.safetensors"}})"));
  auto ck = Checkpoint::open((root / "snapshot").string());
  EXPECT_EQ(ck->get("a").data[1], 6);
}

TEST(Checkpoint, SeveralFilesWithoutIndex) {
  TempDir dir;
  write_file(dir / "x.safetensors", safetensors_bytes({{"a", "U8", {1}, {1}}}));
  write_file(dir / "y.safetensors", safetensors_bytes({{"b", "U8", {2}, {2, 3}}}));
  auto ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ck->get("b").data[1], 3);

  write_file(dir / "z.safetensors", safetensors_bytes({{"a", "U8", {1}, {4}}}));
  expect_load_error([&] { Checkpoint::open(dir.str()); },
                    {"'a'", "x.safetensors", "z.safetensors"});
}

TEST(Checkpoint, MissingOrEmptyFolder) {
  TempDir dir;
  expect_load_error([&] { Checkpoint::open(dir.str()); }, {dir.str(), "no "});
  expect_load_error([&] { Checkpoint::open(dir.str() + "/absent"); }, {"absent"});
}

}  // namespace
}  // namespace serval::io
