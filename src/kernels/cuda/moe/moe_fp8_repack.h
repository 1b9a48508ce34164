// Load-time repacking of FP8 (e4m3) expert stacks into the tiled layout of
// kernels/moe_fp8_layout.h that the grouped MoE GEMMs (moe_gemm.h) read, with zero padding of
// rows and K. The scales are built on the host (backend/moe/moe_fp8_scales.h).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace serval::kernels::cuda {

struct MoeFp8RepackParams {
  const uint8_t* src;  // [experts, src_rows, src_k] e4m3, checkpoint layout
  uint8_t* dst;        // [experts · rows · k] in the layout of kernels/moe_fp8_layout.h
  int experts;
  int src_rows, src_k;
  int rows, k;  // padded: rows % 16 == 0, k % 64 == 0, rows ≥ src_rows, k ≥ src_k
  bool gated;   // GEMM1's gate_up: halves padded separately (kernels::moe_padded_source_row)
};

inline size_t moe_fp8_data_bytes(int experts, int rows, int k) {
  return size_t(experts) * rows * k;
}

// Throws InvalidArgument for shapes outside the contract above.
void moe_fp8_repack(const MoeFp8RepackParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
