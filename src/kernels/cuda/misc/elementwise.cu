// Element-wise and row-gather kernels. Each uses 16-byte vectors when sizes and pointers allow,
// a scalar grid-stride loop otherwise.
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/elementwise.h"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t work) {
  int64_t blocks = (work + kThreads - 1) / kThreads;
  return unsigned(blocks < 65535 * 16 ? (blocks < 1 ? 1 : blocks) : 65535 * 16);
}

__device__ __forceinline__ float silu(float g) {
  return g / (1.0f + __expf(-g));
}

// vec = 8: 16-byte path (inter % 8 == 0, aligned pointers); vec = 1: scalar path.
template <int kVec>
__global__ void silu_mul_kernel(const __nv_bfloat16* __restrict__ x,
                                __nv_bfloat16* __restrict__ out, int rows, int inter, int tile) {
  pdl_wait();
  pdl_launch_dependents();
  const int per_row = inter / kVec;
  const int64_t total = int64_t(rows) * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row;
    const int c = int(i % per_row) * kVec;
    // tile 16: c % 16 + kVec ≤ 16, so a vector stays inside one 16-column gate run.
    const __nv_bfloat16* gate = x + r * 2 * inter + (tile ? 2 * c - c % tile : c);
    const int up = tile ? tile : inter;  // gate → up offset
    if constexpr (kVec == 8) {
      float g[8], u[8];
      load8(gate, g);
      load8(gate + up, u);
#pragma unroll
      for (int j = 0; j < 8; ++j) g[j] = silu(g[j]) * u[j];
      store8(out + r * inter + c, g);
    } else {
      out[r * inter + c] =
          __float2bfloat16(silu(__bfloat162float(gate[0])) * __bfloat162float(gate[up]));
    }
  }
}

// vec = 8: 16-byte path (cols % 8 == 0, aligned pointers); vec = 1: scalar path.
template <int kVec>
__global__ void sigmoid_gate_add_kernel(const __nv_bfloat16* __restrict__ gate,
                                        const __nv_bfloat16* __restrict__ x,
                                        __nv_bfloat16* __restrict__ out, int rows, int cols) {
  pdl_wait();
  pdl_launch_dependents();
  const int per_row = cols / kVec;
  const int64_t total = int64_t(rows) * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row;
    const int64_t at = r * cols + int64_t(i % per_row) * kVec;
    const float g = 1.0f / (1.0f + __expf(-__bfloat162float(gate[r])));
    if constexpr (kVec == 8) {
      float a[8], b[8];
      load8(out + at, a);
      load8(x + at, b);
#pragma unroll
      for (int j = 0; j < 8; ++j) a[j] += g * b[j];
      store8(out + at, a);
    } else {
      out[at] = __float2bfloat16(__bfloat162float(out[at]) + g * __bfloat162float(x[at]));
    }
  }
}

// vec = 8: 16-byte path (n % 8 == 0, aligned pointers); vec = 1: scalar path.
template <int kVec>
__global__ void add_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out,
                           int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t units = n / kVec;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < units;
       i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (kVec == 8) {
      float a[8], b[8];
      load8(out + 8 * i, a);
      load8(x + 8 * i, b);
#pragma unroll
      for (int j = 0; j < 8; ++j) a[j] += b[j];
      store8(out + 8 * i, a);
    } else {
      out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(x[i]));
    }
  }
}

__global__ void bf16_to_float_kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ out,
                                     int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(x[i]);
}

// One CTA per output row; copies `units` elements of type Unit (uint4 = 16 bytes or bf16).
template <typename Unit>
__global__ void gather_rows_kernel(const Unit* __restrict__ src, const int32_t* __restrict__ rows,
                                   Unit* __restrict__ out, int units) {
  pdl_wait();
  pdl_launch_dependents();
  const Unit* s = src + int64_t(rows[blockIdx.x]) * units;
  Unit* d = out + int64_t(blockIdx.x) * units;
  for (int i = threadIdx.x; i < units; i += blockDim.x) d[i] = s[i];
}

}  // namespace

void silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.tile != 0 && (p.tile != 16 || p.inter % 16 != 0))
    throw InvalidArgument("silu_mul: tile must be 0, or 16 with inter % 16 == 0 (got tile " +
                          std::to_string(p.tile) + ", inter " + std::to_string(p.inter) + ")");
  if (p.rows == 0 || p.inter == 0) return;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  if (p.inter % 8 == 0 && is_aligned16(p.x) && is_aligned16(p.out)) {
    launch_pdl("silu_mul", silu_mul_kernel<8>, grid_for(int64_t(p.rows) * p.inter / 8), kThreads, 0,
               stream, x, out, p.rows, p.inter, p.tile);
  } else {
    launch_pdl("silu_mul", silu_mul_kernel<1>, grid_for(int64_t(p.rows) * p.inter), kThreads, 0,
               stream, x, out, p.rows, p.inter, p.tile);
  }
}

void sigmoid_gate_add(const SigmoidGateAddParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return;
  const auto* gate = reinterpret_cast<const __nv_bfloat16*>(p.gate);
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  if (p.cols % 8 == 0 && is_aligned16(p.x) && is_aligned16(p.out)) {
    launch_pdl("sigmoid_gate_add", sigmoid_gate_add_kernel<8>,
               grid_for(int64_t(p.rows) * p.cols / 8), kThreads, 0, stream, gate, x, out, p.rows,
               p.cols);
  } else {
    launch_pdl("sigmoid_gate_add", sigmoid_gate_add_kernel<1>, grid_for(int64_t(p.rows) * p.cols),
               kThreads, 0, stream, gate, x, out, p.rows, p.cols);
  }
}

void add(const AddParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  if (p.n % 8 == 0 && is_aligned16(p.x) && is_aligned16(p.out)) {
    launch_pdl("add", add_kernel<8>, grid_for(p.n / 8), kThreads, 0, stream, x, out, p.n);
  } else {
    launch_pdl("add", add_kernel<1>, grid_for(p.n), kThreads, 0, stream, x, out, p.n);
  }
}

void bf16_to_float(const Bf16ToFloatParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  launch_pdl("bf16_to_float", bf16_to_float_kernel, grid_for(p.n), kThreads, 0, stream,
             reinterpret_cast<const __nv_bfloat16*>(p.x), p.out, p.n);
}

void gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0 || p.cols == 0) return;
  if (p.cols % 8 == 0 && is_aligned16(p.src) && is_aligned16(p.out)) {
    const int units = p.cols / 8;
    const int threads = units < 128 ? 32 * ((units + 31) / 32) : 128;
    launch_pdl("gather_rows", gather_rows_kernel<uint4>, unsigned(p.num_rows), unsigned(threads), 0,
               stream, reinterpret_cast<const uint4*>(p.src), p.rows,
               reinterpret_cast<uint4*>(p.out), units);
  } else {
    launch_pdl("gather_rows", gather_rows_kernel<__nv_bfloat16>, unsigned(p.num_rows), 128u, 0,
               stream, reinterpret_cast<const __nv_bfloat16*>(p.src), p.rows,
               reinterpret_cast<__nv_bfloat16*>(p.out), p.cols);
  }
}

void embedding(const EmbeddingParams& p, cudaStream_t stream) {
  gather_rows({p.table, p.ids, p.out, p.num_tokens, p.hidden}, stream);
}

}  // namespace serval::kernels::cuda
