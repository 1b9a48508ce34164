// Random mutations of a valid file: open() either succeeds with every tensor inside the file,
// or throws LoadError. Anything else (crash, other exception, out-of-bounds view) fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "base/error.h"
#include "io/safetensors.h"
#include "support/fuzz_budget.h"
#include "unit/io/safetensors_writer.h"

namespace serval::io {
namespace {

using testing::pattern;
using testing::safetensors_bytes;
using testing::TempDir;
using testing::write_file;

std::vector<uint8_t> mutate(std::vector<uint8_t> f, std::mt19937& rng) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  // Most mutations go to the header: flips in the data region change nothing structural.
  const size_t header_len = 8 + (f[0] | f[1] << 8);
  auto position = [&] { return pick(4) ? pick(std::min(f.size(), header_len)) : pick(f.size()); };
  // Characters that keep the JSON plausible, so the parser does not reject every mutant.
  static const char kJsonish[] = "0123456789-.,:[]{}\"eE \\u";
  const int edits = pick(4) ? 1 : 2 + int(pick(4));
  for (int e = 0; e < edits && !f.empty(); ++e) {
    switch (pick(6)) {
      case 0:
        f[position()] ^= uint8_t(1u << pick(8));
        break;
      case 1:
        f[position()] = uint8_t(pick(256));
        break;
      case 2:
        f[position()] = uint8_t(kJsonish[pick(sizeof(kJsonish) - 1)]);
        break;
      case 3:
        f.resize(pick(f.size() + 1));
        break;
      case 4: {
        size_t at = position();
        size_t n = 1 + pick(8);
        for (size_t i = 0; i < n; ++i) {
          f.insert(f.begin() + ptrdiff_t(at), uint8_t(kJsonish[pick(sizeof(kJsonish) - 1)]));
        }
        break;
      }
      case 5: {
        size_t at = position(), n = std::min(f.size() - at, 1 + pick(6));
        f.erase(f.begin() + ptrdiff_t(at), f.begin() + ptrdiff_t(at + n));
        break;
      }
    }
  }
  return f;
}

TEST(SafetensorsFuzz, MutantsOpenOrThrowLoadError) {
  TempDir dir;
  const auto valid = safetensors_bytes({{"model.a.weight", "BF16", {3, 4}, pattern(24, 1)},
                                        {"b", "F32", {2}, pattern(8, 2)},
                                        {"c.scale", "F8_E4M3", {5}, pattern(5, 3)},
                                        {"d", "I64", {1, 1}, pattern(8, 4)}},
                                       {{"format", "pt"}});
  // SERVAL_FUZZ_ITERATIONS and SERVAL_FUZZ_SEED allow long manual runs (fuzz_budget.h).
  std::mt19937 rng(serval::testing::fuzz_seed(20240611u));
  const std::string path = (dir / "fuzz.safetensors").string();
  int opened = 0, refused = 0;
  const int iters = serval::testing::fuzz_iterations(2000);
  for (int iter = 0; iter < iters; ++iter) {
    auto bytes = mutate(valid, rng);
    write_file(path, bytes);
    try {
      auto f = SafetensorsFile::open(path);
      ++opened;
      ASSERT_EQ(f->file_size(), bytes.size());
      const uint8_t* lo = f->bytes().data() + f->data_start();
      const uint8_t* hi = f->bytes().data() + f->bytes().size();
      uint64_t sum = 0;
      for (const TensorInfo& t : f->tensors()) {
        ASSERT_GE(t.data, lo) << "iter " << iter << " tensor " << t.name;
        ASSERT_LE(t.nbytes, size_t(hi - t.data)) << "iter " << iter << " tensor " << t.name;
        ASSERT_EQ(uint64_t(t.numel()) * dtype_bits(t.dtype), uint64_t(t.nbytes) * 8);
        for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
      }
      volatile uint64_t sink = sum;  // every byte of every tensor was read
      (void)sink;
    } catch (const LoadError& e) {
      ++refused;
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  // Both outcomes must occur, or the mutator is not exercising anything.
  EXPECT_GT(opened, iters / 100);
  EXPECT_GT(refused, iters / 4);
  std::printf("fuzz: %d opened, %d refused\n", opened, refused);
}

}  // namespace
}  // namespace serval::io
