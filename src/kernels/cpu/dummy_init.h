// Dummy weight values (--load-format dummy) in host memory: the CPU twins of
// kernels/cuda/init/dummy_init.h and the generator model::make_dummy_weights uses. Each fills
// in parallel on ThreadPool::global(); the values depend only on the arguments.
#pragma once
#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cpu {

// out[r·cols + c] for r < rows, c < cols: v = center + (2u − 1)·half_width (fp32, multiply then
// add, each rounded) with u = dummy_uniform(key, offset + r·row_stride + c), stored as `dtype`
// (f32, bf16 or f16, round to nearest even). Error for another dtype.
void dummy_dense(void* out, DType dtype, int64_t rows, int64_t cols, uint64_t key, int64_t offset,
                 int64_t row_stride, float center, float half_width);

// out[j] for j < n: byte j % 8 of the little-endian word splitmix64(key + j / 8) (random bits:
// every NVFP4 code equally likely).
void dummy_bits(uint8_t* out, int64_t n, uint64_t key);

// out[i] = float_to_e4m3((2u − 1)·half_width), u = dummy_uniform(key, i), for i < n.
void dummy_fp8(uint8_t* out, int64_t n, uint64_t key, float half_width);

// out[i] = dummy_code(dummy_uniform(key, i), lo, hi) for i < n.
void dummy_codes(uint8_t* out, int64_t n, uint64_t key, uint8_t lo, uint8_t hi);

}  // namespace serval::kernels::cpu
