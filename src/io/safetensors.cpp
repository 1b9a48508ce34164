#include "io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>

#include "base/error.h"
#include "io/json_reader.h"

namespace serval::io {
namespace {

using nlohmann::json;

// The header nests at most 3 deep ({name: {shape: [...]}}); deeper input is hostile and is
// refused before the JSON parser (and the value destructor) ever see it.
constexpr int kMaxJsonDepth = 8;

[[noreturn]] void fail_tensor(const std::string& path, std::string_view tensor,
                              std::string_view what) {
  throw LoadError(fmt::format("{}: tensor '{}': {}", path, tensor, what));
}

int json_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
  return max_depth;
}

// A non-negative JSON integer (floats and negatives refused), or -1.
int64_t non_negative_int(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    return u > uint64_t(INT64_MAX) ? -1 : int64_t(u);
  }
  if (v.is_number_integer()) return std::max<int64_t>(v.get<int64_t>(), -1);
  return -1;
}

}  // namespace

int64_t TensorInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile(path));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw LoadError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw LoadError(fmt::format("{}: not a regular file", path));
  }
  f->size_ = size_t(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    throw LoadError(
        fmt::format("{}: file has {} bytes, fewer than the 8-byte header length", path, f->size_));
  }
  void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) {
    throw LoadError(
        fmt::format("{}: mmap of {} bytes failed: {}", path, f->size_, std::strerror(mmap_errno)));
  }
  f->base_ = static_cast<const uint8_t*>(p);
  f->parse_header();
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) munmap(const_cast<uint8_t*>(base_), size_);
}

void SafetensorsFile::prefetch() const {
  if (base_) madvise(const_cast<uint8_t*>(base_), size_, MADV_WILLNEED);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

void SafetensorsFile::parse_header() {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];  // u64 little endian
  if (header_len > kMaxHeaderBytes) {
    throw LoadError(fmt::format("{}: header length {} exceeds the limit of {} bytes", path_,
                                header_len, kMaxHeaderBytes));
  }
  if (header_len > size_ - 8) {
    throw LoadError(fmt::format("{}: header length {} runs past the end of the file ({} bytes)",
                                path_, header_len, size_));
  }
  data_start_ = 8 + size_t(header_len);
  const size_t data_size = size_ - data_start_;
  std::string_view text(reinterpret_cast<const char*>(base_ + 8), size_t(header_len));
  if (json_depth(text) > kMaxJsonDepth) {
    throw LoadError(
        fmt::format("{}: header JSON nests deeper than {} levels", path_, kMaxJsonDepth));
  }
  json header = parse_json(text, path_);
  if (!header.is_object()) {
    throw LoadError(
        fmt::format("{}: header must be a JSON object, got {}", path_, json_type_name(header)));
  }

  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        throw LoadError(fmt::format("{}: __metadata__ must be an object, got {}", path_,
                                    json_type_name(entry)));
      }
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          throw LoadError(fmt::format("{}: __metadata__ key '{}' must be a string, got {}", path_,
                                      k, json_type_name(v)));
        }
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) fail_tensor(path_, name, "entry must be an object");
    TensorInfo t;
    t.name = name;
    t.file = path_;

    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) fail_tensor(path_, name, "missing string 'dtype'");
    if (!dtype_from_safetensors(dt->get_ref<const std::string&>(), &t.dtype)) {
      fail_tensor(path_, name, fmt::format("unknown dtype '{}'", dt->get<std::string>()));
    }

    auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array())
      fail_tensor(path_, name, "missing array 'shape'");
    uint64_t numel = 1;
    for (const json& d : *shape) {
      int64_t n = non_negative_int(d);
      if (n < 0)
        fail_tensor(path_, name,
                    fmt::format("shape entry {} is not a non-negative integer", d.dump()));
      if (__builtin_mul_overflow(numel, uint64_t(n), &numel) || numel > uint64_t(INT64_MAX)) {
        fail_tensor(path_, name, fmt::format("shape {} has too many elements", shape->dump()));
      }
      t.shape.push_back(n);
    }

    auto offs = entry.find("data_offsets");
    if (offs == entry.end() || !offs->is_array() || offs->size() != 2) {
      fail_tensor(path_, name, "missing 'data_offsets' [begin, end]");
    }
    int64_t begin = non_negative_int((*offs)[0]), end = non_negative_int((*offs)[1]);
    if (begin < 0 || end < 0) {
      fail_tensor(path_, name,
                  fmt::format("data_offsets {} are not non-negative integers", offs->dump()));
    }
    if (begin > end) {
      fail_tensor(path_, name, fmt::format("data_offsets begin {} > end {}", begin, end));
    }
    if (uint64_t(end) > data_size) {
      fail_tensor(path_, name,
                  fmt::format("data ends at byte {} of the data section but the file has only {} "
                              "data bytes ({} in all)",
                              end, data_size, size_));
    }
    uint64_t bits = 0;
    const std::string& dtype_str = dt->get_ref<const std::string&>();
    if (__builtin_mul_overflow(numel, uint64_t(dtype_bits(t.dtype)), &bits)) {
      fail_tensor(path_, name,
                  fmt::format("{} with shape {} is too large", dtype_str, shape->dump()));
    }
    if (bits % 8 != 0 || bits / 8 != uint64_t(end - begin)) {
      fail_tensor(
          path_, name,
          fmt::format("{} with shape {} needs {} bits ({} bytes) but data_offsets {} span "
                      "{} bytes",
                      dtype_str, shape->dump(), bits, bits / 8.0, offs->dump(), end - begin));
    }
    t.data = base_ + data_start_ + size_t(begin);
    t.nbytes = size_t(end - begin);
    tensors_.push_back(std::move(t));
  }

  // Ranges of different tensors must not overlap (empty tensors overlap nothing).
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors_) {
    if (t.nbytes) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.data < prev.data + prev.nbytes) {
      throw LoadError(
          fmt::format("{}: tensors '{}' and '{}' overlap at byte {} of the data section", path_,
                      prev.name, cur.name, size_t(cur.data - base_ - data_start_)));
    }
  }
  // nlohmann objects iterate in key order, so tensors_ is already sorted by name.
}

}  // namespace serval::io
