// Row-wise argmax. Few rows: each row is split over up to kMaxSplits CTAs, each reducing its slice
// to one packed (value, index) key that it folds into the row's slot with a 64-bit atomicMax; the
// last CTA of the row to arrive (arrival counter) writes the result and resets slot and counter.
// Many rows (or a vocab that fits one CTA): one CTA per row, no atomics.
#include "kernels/cuda/sampling/argmax.h"

#include <algorithm>
#include <cfloat>
#include <string>

#include "base/error.h"
#include "kernels/cuda/misc/device_utils.cuh"
#include "kernels/cuda/misc/pdl.cuh"

namespace serval::kernels::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kUnroll = 4;                         // loads in flight per thread
constexpr int kCtaElems = kThreads * kUnroll * 4;  // one pass of float4 loads: 4096
constexpr int kMaxSplits = 128;                    // CTAs per row
constexpr int kMaxSplitRows = 1024;                // rows with a slot and a counter
constexpr int kLegacyThreads = 1024;

// Slots and arrival counters live in device memory that is zero at module load; the last CTA of a
// row resets both, so they are zero again for the next launch, which touches them only after
// pdl_wait (after this launch completed). As with the other arrival counters of this library,
// two launches must not run concurrently on one device (decode runs one stream per device).
__device__ unsigned long long g_argmax_slots[kMaxSplitRows];
__device__ unsigned int g_argmax_arrivals[kMaxSplitRows];

// Monotone map of a float onto uint32 (larger float → larger integer).
__device__ __forceinline__ uint32_t orderable(float f) {
  uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Candidate (value, index) as a key: larger value first, then the lower index. Only numbers
// ≥ −FLT_MAX (not NaN, not −inf) are candidates; 0 means none (every candidate key is larger).
// −0 counts as +0 (equal values: the lower index wins, as between threads' running bests).
__device__ __forceinline__ unsigned long long make_key(float v, int index) {
  v = v == 0.0f ? 0.0f : v;
  return (static_cast<unsigned long long>(orderable(v)) << 32) |
         static_cast<unsigned long long>(0xffffffffu - uint32_t(index));
}

__device__ __forceinline__ int key_index(unsigned long long key) {
  return int(0xffffffffu - uint32_t(key & 0xffffffffu));
}

// One thread's running best over ascending indices: strict > keeps the first of equal values and
// never takes NaN or −inf (best starts at −inf with no index).
struct Running {
  float value = -INFINITY;
  int index = -1;
  __device__ __forceinline__ void see(float x, int i) {
    if (x > value) {
      value = x;
      index = i;
    }
  }
  __device__ __forceinline__ unsigned long long key() const {
    return index >= 0 ? make_key(value, index) : 0ull;
  }
};

__device__ __forceinline__ unsigned long long max_key(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}

// Largest key of the CTA, valid in thread 0.
__device__ __forceinline__ unsigned long long block_max_key(unsigned long long key) {
  __shared__ unsigned long long warp_keys[kThreads / 32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) key = max_key(key, __shfl_xor_sync(kFull, key, off));
  if (threadIdx.x % 32 == 0) warp_keys[threadIdx.x / 32] = key;
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) key = max_key(key, warp_keys[w]);
  }
  return key;
}

// Grid (rows, splits). CTA s of row r scans elements [s·per, min((s+1)·per, vocab)) (per a
// multiple of 4), kUnroll loads per thread in flight; kVec: 16-byte loads (row start 16-byte
// aligned and vocab % 4 == 0). Each thread visits its elements in ascending order.
template <bool kVec>
__global__ void __launch_bounds__(kThreads) argmax_split_kernel(ArgmaxParams p, int per) {
  pdl_wait();
  pdl_launch_dependents();
  const int r = blockIdx.x, splits = gridDim.y;
  const float* row = p.logits + size_t(r) * p.vocab;
  const int begin = blockIdx.y * per;
  const int end = min(begin + per, p.vocab);
  Running best;
  if constexpr (kVec) {
    for (int base = begin + threadIdx.x * 4; base < end; base += kThreads * 4 * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads * 4;
        v[u] = i < end ? *reinterpret_cast<const float4*>(row + i)
                       : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads * 4;
        best.see(v[u].x, i);
        best.see(v[u].y, i + 1);
        best.see(v[u].z, i + 2);
        best.see(v[u].w, i + 3);
      }
    }
  } else {
    for (int base = begin + threadIdx.x; base < end; base += kThreads * kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads;
        v[u] = i < end ? row[i] : -INFINITY;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) best.see(v[u], base + u * kThreads);
    }
  }
  const unsigned long long key = block_max_key(best.key());
  if (threadIdx.x != 0) return;
  if (splits == 1) {
    p.out[r] = key != 0 ? key_index(key) : 0;
    return;
  }
  if (key != 0) atomicMax(&g_argmax_slots[r], key);
  // The arrival releases this CTA's slot update and, for the last, acquires the others'.
  if (arrive_acq_rel(&g_argmax_arrivals[r]) != unsigned(splits - 1)) return;
  const unsigned long long row_key = atomicExch(&g_argmax_slots[r], 0ull);
  g_argmax_arrivals[r] = 0;
  p.out[r] = row_key != 0 ? key_index(row_key) : 0;
}

struct Best {
  float value;
  int index;
};

__device__ Best better(Best a, Best b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// The previous kernel (argmax_single_cta): one CTA of 1024 threads per row.
__global__ void argmax_legacy_kernel(ArgmaxParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const float* row = p.logits + size_t(blockIdx.x) * p.vocab;
  Best best{-FLT_MAX, p.vocab};
  for (int v = threadIdx.x; v < p.vocab; v += kLegacyThreads) {
    float x = row[v];
    if (x == x) best = better(best, Best{x, v});  // skip NaN
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best other{__shfl_xor_sync(kFull, best.value, offset),
               __shfl_xor_sync(kFull, best.index, offset)};
    best = better(best, other);
  }
  __shared__ Best warp_best[kLegacyThreads / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    Best b = warp_best[0];
    for (int w = 1; w < kLegacyThreads / 32; ++w) b = better(b, warp_best[w]);
    p.out[blockIdx.x] = b.index < p.vocab ? b.index : 0;
  }
}

void check(const ArgmaxParams& p, const char* name) {
  if (p.rows < 0 || p.vocab < 1)
    throw InvalidArgument(std::string(name) + ": need rows ≥ 0 and vocab ≥ 1 (got rows " +
                          std::to_string(p.rows) + ", vocab " + std::to_string(p.vocab) + ")");
}

}  // namespace

void argmax(const ArgmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  check(p, "argmax");
  int splits = 1;
  if (p.rows <= kMaxSplitRows) splits = std::min((p.vocab + kCtaElems - 1) / kCtaElems, kMaxSplits);
  const int per = ((p.vocab + splits - 1) / splits + 3) / 4 * 4;
  const bool vec =
      p.vocab % 4 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;  // every row aligned
  launch_pdl("argmax", vec ? argmax_split_kernel<true> : argmax_split_kernel<false>,
             dim3(unsigned(p.rows), unsigned(splits)), dim3(kThreads), 0, stream, p, per);
}

void argmax_single_cta(const ArgmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  check(p, "argmax_single_cta");
  launch_pdl("argmax (single CTA)", argmax_legacy_kernel, dim3(unsigned(p.rows)),
             dim3(kLegacyThreads), 0, stream, p);
}

}  // namespace serval::kernels::cuda
