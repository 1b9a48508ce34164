// Read-only, bounds-checked access to .safetensors files and to a model folder's checkpoint.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"

namespace serval::io {

// One tensor of a mapped file. `data` points into the file mapping (valid while the owning
// SafetensorsFile lives) and is NOT necessarily aligned: the header length is arbitrary.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major; empty = scalar
  const uint8_t* data = nullptr;
  size_t nbytes = 0;  // == numel() * dtype_bits(dtype) / 8, checked at open
  std::string file;   // path of the file that holds it, for error messages
  int64_t numel() const;
};

// A .safetensors file mapped read-only (MAP_PRIVATE, PROT_READ). open() validates the whole
// header against the file: sizes, dtypes, shapes, offsets in bounds, no overlapping ranges.
// After open() succeeds, every TensorInfo::data[0, nbytes) lies inside the mapping.
// (Truncating the file on disk while it is mapped is outside this contract: SIGBUS.)
class SafetensorsFile {
 public:
  // The header (8-byte length + JSON) may not exceed this.
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  // LoadError naming `path` (and the tensor) if the file is missing or malformed.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }
  // The whole mapped file; every tensor's bytes lie inside it, after the header.
  std::span<const uint8_t> bytes() const { return {base_, size_}; }
  size_t data_start() const { return data_start_; }  // 8 + header length
  // Sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  // The "__metadata__" entry (string to string; empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Asks the kernel to read the data region ahead (MADV_WILLNEED); a hint only.
  void prefetch() const;

 private:
  explicit SafetensorsFile(std::string path) : path_(std::move(path)) {}
  void parse_header();

  std::string path_;
  const uint8_t* base_ = nullptr;  // mapping of the whole file
  size_t size_ = 0;
  size_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a model folder, from (in this order of preference):
//   model.safetensors.index.json + the shards its weight_map names,
//   model.safetensors, or
//   every *.safetensors file in the folder (a tensor name may then appear only once).
class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> open(const std::string& model_dir);

  const std::string& dir() const { return dir_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  // LoadError naming the tensor and the folder if absent.
  const TensorInfo& get(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return by_name_.size(); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  explicit Checkpoint(std::string dir) : dir_(std::move(dir)) {}
  void open_index(const std::string& index_path);
  void add_file(std::unique_ptr<SafetensorsFile> f);

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*, std::less<>> by_name_;
};

}  // namespace serval::io
