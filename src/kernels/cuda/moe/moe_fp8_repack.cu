// FP8 expert repacking (load time only; simple: one thread per 32-bit output word, each byte
// found through the layout's inverse, kernels::moe_fp8_element_at).
#include "kernels/cuda/moe/moe_fp8_repack.h"

#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/moe_fp8_layout.h"

namespace serval::kernels::cuda {

namespace {

__global__ void repack_kernel(MoeFp8RepackParams p, size_t total_words) {
  const size_t words_per_expert = size_t(p.rows) * p.k / 4;
  for (size_t w = blockIdx.x * size_t(blockDim.x) + threadIdx.x; w < total_words;
       w += size_t(gridDim.x) * blockDim.x) {
    const int e = int(w / words_per_expert);
    const size_t at = (w % words_per_expert) * 4;
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const MoeFp8Element el = moe_fp8_element_at(at + b, p.k);
      const int src_row = moe_padded_source_row(el.row, p.src_rows, p.rows, p.gated);
      if (src_row < 0 || el.col >= p.src_k) continue;
      const uint32_t v = p.src[(size_t(e) * p.src_rows + src_row) * p.src_k + el.col];
      word |= v << (8 * b);
    }
    reinterpret_cast<uint32_t*>(p.dst)[w] = word;
  }
}

}  // namespace

void moe_fp8_repack(const MoeFp8RepackParams& p, cudaStream_t stream) {
  if (p.experts <= 0 || !moe_fp8_padding_ok(p.src_rows, p.src_k, p.rows, p.k, p.gated))
    throw InvalidArgument(
        "moe_fp8_repack: unsupported shape (experts=" + std::to_string(p.experts) + ", source " +
        std::to_string(p.src_rows) + "×" + std::to_string(p.src_k) + ", padded " +
        std::to_string(p.rows) + "×" + std::to_string(p.k) + "; need rows % 16, k % 64)");
  const size_t words = moe_fp8_data_bytes(p.experts, p.rows, p.k) / 4;
  const size_t blocks = (words + 255) / 256;
  repack_kernel<<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(p, words);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("CUDA launch of moe_fp8_repack failed: ") + cudaGetErrorString(e));
}

}  // namespace serval::kernels::cuda
