// Host-side layout helpers of quant_gemm (load time): padded sizes and the repacking of
// checkpoint NVFP4 / FP8 weights and scales into the fragment layout described in quant_gemm.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cuda/gemm/quant_gemm.h"
#include "kernels/fp8_multiplier.h"
#include "kernels/nvfp4_word.h"

namespace serval::kernels::cuda {

namespace {
constexpr Nvfp4WordTable kWordBits = make_nvfp4_word_table();
}  // namespace

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

// Each lane word is assembled from whole source bytes: a column pair (2t, 2t+1) of one row is one
// NVFP4 byte (low nibble = even column) or two adjacent FP8 bytes, so a word costs a few loads and
// shifts instead of per-nibble index arithmetic (a 70B model has ~5 G codes to pack at start-up).
std::vector<uint8_t> quant_gemm_pack_data(WeightFormat format, const uint8_t* src, int n, int k) {
  const bool fp4 = format == WeightFormat::kNvfp4;
  const int n_tiles = quant_gemm_n_pad(n) / 32, k_blocks = quant_gemm_k_pad(k) / 64;
  const int bytes_per_lane = fp4 ? 16 : 32;
  const size_t row_bytes = fp4 ? size_t(k) / 2 : size_t(k);
  std::vector<uint8_t> out(quant_gemm_data_bytes(format, n, k), 0);
  // Codes of columns (col, col+1) of `row` (col even): the NVFP4 byte, or the two FP8 bytes as
  // low | high << 8; 0 outside the matrix (k is even, so a pair is wholly in or out).
  auto pair = [&](int row, int col) -> uint32_t {
    if (row >= n || col >= k) return 0;
    const uint8_t* p = src + size_t(row) * row_bytes + (fp4 ? size_t(col) / 2 : size_t(col));
    return fp4 ? p[0] : uint32_t(p[0]) | uint32_t(p[1]) << 8;
  };
  ThreadPool::global().parallel_for(n_tiles, 4, [&](int64_t tile_begin, int64_t tile_end) {
    for (int rt = int(tile_begin); rt < int(tile_end); ++rt)
      for (int kb = 0; kb < k_blocks; ++kb)
        for (int h = 0; h < 2; ++h)
          for (int lane = 0; lane < 32; ++lane) {
            uint8_t* dst =
                out.data() + ((size_t(rt * k_blocks + kb) * 2 + h) * 32 + lane) * bytes_per_lane;
            auto store = [dst](int word, uint32_t v) { std::memcpy(dst + 4 * word, &v, 4); };
            const int g = lane / 4, t = lane % 4;
            const int row_lo = rt * 32 + h * 16 + g, row_hi = row_lo + 8;
            for (int s = 0; s < 4; ++s) {
              const int c = kb * 64 + 16 * t + 4 * s;
              // Register a_i: rows (g, g+8, g, g+8), columns (c, c, c+2, c+2) for i = 0..3.
              const uint32_t a[4] = {pair(row_lo, c), pair(row_hi, c), pair(row_lo, c + 2),
                                     pair(row_hi, c + 2)};
              if (fp4) {
                // a_i: low nibble (even column) as the lo code, high nibble as hi
                // (kernels/nvfp4_word.h).
                uint32_t w = 0;
                for (int i = 0; i < 4; ++i)
                  w |= kWordBits[size_t(i)][0][a[i] & 0xFu] | kWordBits[size_t(i)][1][a[i] >> 4];
                store(s, w);
              } else {
                // Word 2s + j: a_2j in bytes 1 (even column) and 3, a_2j+1 in bytes 0 and 2.
                for (int j = 0; j < 2; ++j) {
                  const uint32_t even = a[2 * j], odd = a[2 * j + 1];
                  store(2 * s + j,
                        (even & 0xFFu) << 8 | (even >> 8) << 24 | (odd & 0xFFu) | (odd >> 8) << 16);
                }
              }
            }
          }
  });
  return out;
}

std::vector<uint8_t> quant_gemm_pack_nvfp4_scales(const uint8_t* src, int n, int k) {
  const int cols = k / 16, k_blocks = quant_gemm_k_pad(k) / 64;
  std::vector<uint8_t> out(size_t(quant_gemm_n_pad(n)) * k_blocks * 4, 0);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < cols; ++c)
      out[size_t(quant_gemm_nvfp4_scale_offset(r, c, k_blocks))] = src[size_t(r) * cols + c];
  return out;
}

std::vector<bf16> quant_gemm_pack_block_scales(const float* src, size_t count) {
  std::vector<bf16> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = fp8_block_multiplier(src[i], i);
  return out;
}

}  // namespace serval::kernels::cuda
