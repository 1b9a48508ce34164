// Host-side layout helpers of quant_gemm (load time): padded sizes and the repacking of
// checkpoint NVFP4 / FP8 weights and scales into the fragment layout described in quant_gemm.h.
#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cuda/gemm/quant_gemm.h"

namespace serval::kernels::cuda {

int quant_gemm_n_pad(int n) {
  return (n + 31) / 32 * 32;
}
int quant_gemm_k_pad(int k) {
  return (k + 63) / 64 * 64;
}

size_t quant_gemm_data_bytes(WeightFormat format, int n, int k) {
  const size_t elems = size_t(quant_gemm_n_pad(n)) * quant_gemm_k_pad(k);
  return format == WeightFormat::kNvfp4 ? elems / 2 : elems;
}

std::vector<uint8_t> quant_gemm_pack_data(WeightFormat format, const uint8_t* src, int n, int k) {
  const bool fp4 = format == WeightFormat::kNvfp4;
  const int n_tiles = quant_gemm_n_pad(n) / 32, k_blocks = quant_gemm_k_pad(k) / 64;
  const int bytes_per_lane = fp4 ? 16 : 32;
  std::vector<uint8_t> out(quant_gemm_data_bytes(format, n, k), 0);
  // Row tiles write disjoint output ranges: pack them in parallel (a 70B model has ~5 G codes).
  ThreadPool::global().parallel_for(n_tiles, 4, [&](int64_t tile_begin, int64_t tile_end) {
    for (int rt = int(tile_begin); rt < int(tile_end); ++rt)
      for (int kb = 0; kb < k_blocks; ++kb)
        for (int h = 0; h < 2; ++h)
          for (int lane = 0; lane < 32; ++lane) {
            uint8_t* dst =
                out.data() + ((size_t(rt * k_blocks + kb) * 2 + h) * 32 + lane) * bytes_per_lane;
            const int g = lane / 4, t = lane % 4;
            for (int s = 0; s < 4; ++s)
              for (int i = 0; i < 4; ++i)
                for (int half = 0; half < 2; ++half) {
                  const int row = rt * 32 + h * 16 + g + 8 * (i & 1);
                  const int col = kb * 64 + s * 16 + 2 * t + 8 * (i >> 1) + half;
                  if (row >= n || col >= k) continue;  // padding stays code 0
                  if (fp4) {
                    const uint8_t byte = src[size_t(row) * (k / 2) + col / 2];
                    const uint8_t code = (col & 1) ? byte >> 4 : byte & 0xF;
                    const int nibble = half ? 7 - i : 3 - i;  // within word s
                    dst[4 * s + nibble / 2] |= uint8_t(code << (4 * (nibble & 1)));
                  } else {
                    const uint8_t code = src[size_t(row) * k + col];
                    const int word = 2 * s + (i >> 1);
                    const int byte = (i & 1) ? (half ? 2 : 0) : (half ? 3 : 1);
                    dst[4 * word + byte] = code;
                  }
                }
          }
  });
  return out;
}

std::vector<uint8_t> quant_gemm_pack_nvfp4_scales(const uint8_t* src, int n, int k) {
  const int cols = k / 16, cols_pad = quant_gemm_k_pad(k) / 16;
  std::vector<uint8_t> out(size_t(quant_gemm_n_pad(n)) * cols_pad, 0);
  for (int r = 0; r < n; ++r)
    std::copy(src + size_t(r) * cols, src + size_t(r + 1) * cols,
              out.data() + size_t(r) * cols_pad);
  return out;
}

std::vector<bf16> quant_gemm_pack_block_scales(const float* src, size_t count) {
  std::vector<bf16> out(count);
  for (size_t i = 0; i < count; ++i) {
    const float s = src[i];
    if (!(s >= 0.0f && s < 256.0f))
      throw InvalidArgument("FP8 block scale " + std::to_string(i) + " = " + std::to_string(s) +
                            " is outside [0, 256) (the CUDA GEMM folds 2^120 into bf16 scales)");
    out[i] = float_to_bf16(std::ldexp(s, 120));
  }
  return out;
}

}  // namespace serval::kernels::cuda
