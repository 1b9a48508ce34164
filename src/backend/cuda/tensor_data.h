// Typed views of a CUDA backend tensor's device data (no checks: callers check dtypes).
#pragma once
#include "tensor/tensor.h"

namespace serval::backend::cuda {

inline const bf16* bf(const Tensor& t) {
  return static_cast<const bf16*>(t.data);
}
inline bf16* bf_mut(Tensor& t) {
  return static_cast<bf16*>(t.data);
}

}  // namespace serval::backend::cuda
