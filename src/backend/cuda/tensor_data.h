// Typed views of a CUDA backend tensor's device data (no checks: callers check dtypes with
// expect).
#pragma once
#include <string>

#include "base/error.h"
#include "tensor/tensor.h"

namespace serval::backend::cuda {

inline const bf16* bf(const Tensor& t) {
  return static_cast<const bf16*>(t.data);
}
inline bf16* bf_mut(Tensor& t) {
  return static_cast<bf16*>(t.data);
}

// Error naming `what` unless t holds `dtype`.
inline void expect(const Tensor& t, DType dtype, const char* what) {
  if (t.dtype != dtype)
    throw Error(std::string("cuda backend: ") + what + " must be " +
                std::string(dtype_name(dtype)) + ", got " + std::string(dtype_name(t.dtype)));
}

}  // namespace serval::backend::cuda
