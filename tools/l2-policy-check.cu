// Which L2 cache-policy PTX forms run on this GPU, one per process (a trap poisons the context).
// Variants: 0/1 evict_first without/with the fraction, 2/3 evict_unchanged without/with it,
// 4 evict_normal (ld.global.nc with .L2::cache_hint), 5/6 cp.async with .L2::cache_hint
// without/with src-size. All run on the H200 (bench/RESULTS.md 2026-12-02): the decode GEMV's
// hinted copies trapped only where ptxas emitted the uniform-register LDGSTS form ([R+UR+imm]),
// which cp_async_16_policy now avoids. Not part of the build (no GPU in CI):
//   nvcc -O2 -arch=sm_90a tools/l2-policy-check.cu -o build-trace/l2-policy-check
//   for v in 0 1 2 3 4 5 6; do build-trace/l2-policy-check $v; done
#include <cstdint>
#include <cstdio>
#include <cstdlib>

template <int V>
__device__ uint64_t policy() {
  uint64_t p = 0;
  if constexpr (V == 0) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0;" : "=l"(p));
  if constexpr (V == 1 || V >= 5)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  if constexpr (V == 2)
    asm volatile("createpolicy.fractional.L2::evict_unchanged.b64 %0;" : "=l"(p));
  if constexpr (V == 3)
    asm volatile("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;" : "=l"(p));
  if constexpr (V == 4)
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}

template <int V>
__global__ void copy(const uint4* in, uint4* out) {
  __shared__ uint4 s[256];
  const uint64_t p = policy<V>();
  const int i = threadIdx.x;
  uint4 v;
  if constexpr (V <= 4) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(in + i), "l"(p));
  } else {
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(s + i));
    if constexpr (V == 5)
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst),
                   "l"(in + i), "l"(p)
                   : "memory");
    else
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, 16, %2;" ::"r"(dst),
                   "l"(in + i), "l"(p)
                   : "memory");
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
    v = s[i];
  }
  out[i] = v;
}

int main(int argc, char** argv) {
  const int v = argc > 1 ? std::atoi(argv[1]) : 0;
  uint4 host[256];
  for (int i = 0; i < 256; ++i) host[i] = make_uint4(i, 2 * i, 3 * i, 4 * i);
  uint4 *in, *out;
  cudaMalloc(&in, sizeof(host));
  cudaMalloc(&out, sizeof(host));
  cudaMemcpy(in, host, sizeof(host), cudaMemcpyHostToDevice);
  cudaMemset(out, 0, sizeof(host));
  void (*kernels[])(const uint4*, uint4*) = {copy<0>, copy<1>, copy<2>, copy<3>,
                                             copy<4>, copy<5>, copy<6>};
  if (v < 0 || v > 6) return 2;
  kernels[v]<<<1, 256>>>(in, out);
  const cudaError_t e = cudaDeviceSynchronize();
  uint4 got[256];
  bool ok =
      e == cudaSuccess && cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost) == cudaSuccess;
  for (int i = 0; ok && i < 256; ++i) ok = got[i].x == host[i].x && got[i].w == host[i].w;
  std::printf("variant %d: %s (%s)\n", v, ok ? "ok" : "FAILED", cudaGetErrorString(e));
  return ok ? 0 : 1;
}
