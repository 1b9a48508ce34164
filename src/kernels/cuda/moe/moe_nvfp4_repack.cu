// NVFP4 expert repacking (load time only; simple, one thread per output word / scale byte).
#include "kernels/cuda/moe/moe_nvfp4_repack.h"

#include <cuda_runtime.h>

#include <string>

#include "base/error.h"
#include "kernels/nvfp4_word.h"

namespace serval::kernels::cuda {

namespace {

// Source row of padded row r, or −1 for a padding row.
__device__ __forceinline__ int source_row(const MoeNvfp4RepackParams& p, int r) {
  if (!p.gated) return r < p.src_rows ? r : -1;
  const int half = r / (p.rows / 2), i = r % (p.rows / 2), src_half = p.src_rows / 2;
  return i < src_half ? half * src_half + i : -1;
}

__device__ __forceinline__ uint32_t source_code(const MoeNvfp4RepackParams& p, int e, int srow,
                                                int col) {
  if (srow < 0 || col >= p.src_k) return 0;
  const uint8_t b = p.src_data[(size_t(e) * p.src_rows + srow) * (p.src_k / 2) + col / 2];
  return (col & 1) ? (b >> 4) : (b & 0xf);
}

__global__ void repack_codes_kernel(MoeNvfp4RepackParams p, size_t total_words) {
  const size_t words_per_expert = size_t(p.rows) * p.k / 8;
  const int kb_count = p.k / 64;
  for (size_t w = blockIdx.x * size_t(blockDim.x) + threadIdx.x; w < total_words;
       w += size_t(gridDim.x) * blockDim.x) {
    const int e = int(w / words_per_expert);
    const size_t rem = w % words_per_expert;
    const int tile = int(rem / 128), lane = int(rem % 128) / 4, kk = int(rem % 4);
    const int mt = tile / kb_count, kb = tile % kb_count;
    const int g = lane / 4, t4 = lane % 4;
    const int c0 = kb * 64 + kk * 16 + 2 * t4;
    const int r_lo = source_row(p, mt * 16 + g), r_hi = source_row(p, mt * 16 + g + 8);
    // MMA register j's two codes (low half: column c, high half: column c + 1), placed in the
    // word as kernels/nvfp4_word.h says.
    const int rows_of[4] = {r_lo, r_hi, r_lo, r_hi}, cols_of[4] = {c0, c0, c0 + 8, c0 + 8};
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      word |= nvfp4_word_bits(source_code(p, e, rows_of[j], cols_of[j]), j, 0);
      word |= nvfp4_word_bits(source_code(p, e, rows_of[j], cols_of[j] + 1), j, 1);
    }
    reinterpret_cast<uint32_t*>(p.dst_data)[w] = word;
  }
}

__global__ void repack_scales_kernel(MoeNvfp4RepackParams p, size_t total_bytes) {
  const size_t bytes_per_expert = size_t(p.rows) * p.k / 16;
  const int kb_count = p.k / 64, src_blocks = p.src_k / 16;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total_bytes;
       i += size_t(gridDim.x) * blockDim.x) {
    const int e = int(i / bytes_per_expert);
    const size_t rem = i % bytes_per_expert;
    const int tile = int(rem / 64), b = int(rem % 64);
    const int mt = tile / kb_count, kb = tile % kb_count;
    const int g = b / 8, kk = (b % 8) / 2, h = b % 2;
    const int srow = source_row(p, mt * 16 + g + 8 * h), block = kb * 4 + kk;
    uint8_t v = 0;
    if (srow >= 0 && block < src_blocks)
      v = p.src_scales[(size_t(e) * p.src_rows + srow) * src_blocks + block];
    p.dst_scales[i] = v;
  }
}

void check_launch(const char* name) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("CUDA launch of ") + name + " failed: " + cudaGetErrorString(e));
}

int grid_for(size_t n) {
  const size_t blocks = (n + 255) / 256;
  return int(blocks < 65536 ? blocks : 65536);
}

}  // namespace

void moe_nvfp4_repack(const MoeNvfp4RepackParams& p, cudaStream_t stream) {
  const bool ok = p.experts > 0 && p.src_rows > 0 && p.src_k > 0 && p.src_k % 16 == 0 &&
                  p.rows % 16 == 0 && p.k % 64 == 0 && p.rows >= p.src_rows && p.k >= p.src_k &&
                  (!p.gated || (p.src_rows % 2 == 0 && p.rows % 32 == 0));
  if (!ok)
    throw InvalidArgument("moe_nvfp4_repack: unsupported shape (experts=" +
                          std::to_string(p.experts) + ", source " + std::to_string(p.src_rows) +
                          "×" + std::to_string(p.src_k) + ", padded " + std::to_string(p.rows) +
                          "×" + std::to_string(p.k) + "; need src_k % 16, rows % 16, k % 64)");
  const size_t words = moe_nvfp4_data_bytes(p.experts, p.rows, p.k) / 4;
  const size_t scale_bytes = moe_nvfp4_scale_bytes(p.experts, p.rows, p.k);
  repack_codes_kernel<<<grid_for(words), 256, 0, stream>>>(p, words);
  check_launch("moe_nvfp4_repack codes");
  repack_scales_kernel<<<grid_for(scale_bytes), 256, 0, stream>>>(p, scale_bytes);
  check_launch("moe_nvfp4_repack scales");
}

}  // namespace serval::kernels::cuda
