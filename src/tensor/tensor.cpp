#include "tensor/tensor.h"

#include <cstdlib>
#include <new>

#include "base/error.h"
#include "base/math.h"

namespace serval {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t Tensor::nbytes() const {
  return size_t(numel()) * dtype_bits(dtype) / 8;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  check(rank() >= 1 && begin >= 0 && begin <= end && end <= shape[0], "Tensor::rows range");
  Tensor t = *this;
  size_t row_bytes = shape[0] == 0 ? 0 : nbytes() / size_t(shape[0]);
  t.data = static_cast<char*>(data) + begin * row_bytes;
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::reshape(Shape new_shape) const {
  Tensor t = *this;
  t.shape = std::move(new_shape);
  check(t.numel() == numel(), "Tensor::reshape keeps the element count");
  return t;
}

Tensor host_empty(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  size_t bytes = round_up<size_t>(std::max<size_t>(t.nbytes(), 1), 64);
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw OutOfResources("host allocation of " + std::to_string(bytes) + " bytes failed");
  t.storage = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data = p;
  return t;
}

Tensor host_view(const void* data, DType dtype, Shape shape, std::shared_ptr<void> keep_alive) {
  Tensor t;
  t.storage = std::move(keep_alive);
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

}  // namespace serval
