// Device helpers shared by the bf16 kernels: 16-byte bf16 vectors, warp/block reductions, and the
// host-side launch check. Included only by .cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "base/error.h"

namespace serval::kernels::cuda {

// Eight bf16 values: one 16-byte load or store (as uint4: a struct of bf16 pairs compiled to four
// 4-byte accesses). Pointers must be 16-byte aligned.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // a bf16's fp32 value is its bits shifted up 16 (exact)
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    words[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
}

// d = a · b on bf16x2, round to nearest even (fma with −0, so signed zeros and exact products are
// kept; subnormal inputs are honoured by bf16 arithmetic).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// silu(g) = g / (1 + e^−g) by ex2.approx and a fast division (two MUFU operations instead of
// expf's range reduction and an IEEE division: the MoE GEMMs' SwiGLU epilogue ran 2–3 % faster
// on the H200). Error a few fp32 ulp, far below the bf16 rounding of what the callers store;
// g ≪ 0 gives e^−g = inf and a zero.
__device__ __forceinline__ float fast_silu(float g) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.4426950408889634f));
  return __fdividef(g, 1.0f + e);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds 32 floats. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();  // scratch may be reused by the caller
  return v;
}

// Σ_i block_sum(part[i]), the V block sums added in index order starting from 0 — so a kernel
// that spreads the parts over V blocks and adds their block sums in the same order gets the same
// bits (rms_norm's one-CTA and cluster kernels). `scratch` holds V · 32 floats. Contains
// __syncthreads: call from all threads.
template <int V>
__device__ __forceinline__ float block_sum_parts(const float (&part)[V], float (*scratch)[32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float v = warp_sum(part[i]);
    if (lane == 0) scratch[i][warp] = v;
  }
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) total += warp_sum(lane < num_warps ? scratch[i][lane] : 0.0f);
  __syncthreads();  // scratch may be reused by the caller
  return total;
}

// SM count of the current device, queried once per device (host cost matters: eager decode
// steps launch kernels whose grids depend on it every step); 132 (an H100/H200) if unknown.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 132;
  }
  if (device >= 0 && device < kMaxDevices) {
    count = cached[device].load(std::memory_order_relaxed);
    if (count > 0) return count;
  }
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      count <= 0) {
    cudaGetLastError();
    return 132;
  }
  if (device >= 0 && device < kMaxDevices) cached[device].store(count, std::memory_order_relaxed);
  return count;
}

// One arrival at a last-arriver merge: atomicAdd(counter, 1) with acq_rel semantics at GPU scope;
// returns the old count. Release: the caller's stores, and (cumulativity) those of every thread
// that passed a barrier with it before the call, are visible to the arrival that completes the
// count. Acquire: that arrival then sees every earlier arrival's stores, and so do the threads of
// its CTA (warp) after a barrier (__syncthreads, __syncwarp) with it. Stands for a
// __threadfence() (a sequentially consistent fence) in every thread before and after a relaxed
// atomicAdd: the merge needs release / acquire only.
__device__ __forceinline__ unsigned arrive_acq_rel(unsigned* counter) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(counter), "r"(1u)
               : "memory");
  return old;
}

// 16 bytes of read-only data streamed past L1 (weights read once per kernel).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// D(16×8) += A(16×16, row-major) · B(16×8, col-major), bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

inline bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Throws serval::Error naming the kernel if its launch failed.
inline void check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw Error(std::string("CUDA kernel ") + kernel +
                " failed to launch: " + cudaGetErrorString(e));
  }
}

}  // namespace serval::kernels::cuda
