// Tensor: a typed, shaped handle on contiguous memory of one device, sharing its storage.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace serval {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);

// Row-major contiguous tensor. Copies share the storage (like a shared_ptr); `data` may point
// inside it (a view). Packed fp4 tensors hold two elements per byte.
struct Tensor {
  std::shared_ptr<void> storage;
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Device device = Device::kCpu;

  int64_t numel() const;
  size_t nbytes() const;
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  int rank() const { return int(shape.size()); }
  bool defined() const { return data != nullptr || numel() == 0; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // Same storage, new shape with the same element count.
  Tensor reshape(Shape new_shape) const;
};

// Host allocation, 64-byte aligned, uninitialized.
Tensor host_empty(DType dtype, Shape shape);
// Host tensor that does not own `data` (e.g. a mmap'd checkpoint); `keep_alive` is retained.
Tensor host_view(const void* data, DType dtype, Shape shape, std::shared_ptr<void> keep_alive);

}  // namespace serval
