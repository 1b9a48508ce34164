// Test helper: writes .safetensors files (valid or deliberately broken) and temp model folders.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"

namespace serval::io::testing {

struct TensorSpec {
  std::string name;
  std::string dtype;  // safetensors dtype string
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The safetensors dtype string of the types the tests write (bf16, f16, f32, e4m3, u8).
inline std::string safetensors_dtype(DType t) {
  switch (t) {
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kU8:
      return "U8";
    default:
      throw std::invalid_argument(
          "safetensors_dtype: the test writer takes bf16, f16, f32, e4m3 or u8");
  }
}

// 8-byte little-endian header length + header text + data.
inline std::vector<uint8_t> raw_file(uint64_t header_len, const std::string& header,
                                     const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(header_len >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + ptrdiff_t(header.size()));
  return out;
}
inline std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data) {
  return raw_file(header.size(), header, data);
}

// A well-formed file: tensors laid out back to back in the given order.
inline std::vector<uint8_t> safetensors_bytes(
    const std::vector<TensorSpec>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata = {}) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<uint8_t> data;
  for (const TensorSpec& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  if (!metadata.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  // Like the reference writer, pad the header with spaces so the data starts 8-byte aligned.
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return raw_file(text, data);
}

// Removes `p` before writing: ext4 flushes a file truncated-and-rewritten in place on close
// (auto_da_alloc), which made the fuzz loop wait on the disk.
inline void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::filesystem::remove(p);
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}
inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::remove(p);
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// Bytes 0, 1, 2, ... scaled by `seed`, so every tensor's content is distinct.
inline std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 31 + seed * 7 + 1);
  return v;
}

// A fresh folder under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("serval_io_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace serval::io::testing
