// The fp32 dot product every CPU linear kernel uses: one fixed summation order, so a quantized
// linear equals the dense linear of its dequantized weights bit for bit.
#pragma once

namespace serval::kernels::cpu {

inline float dot(const float* a, const float* b, int n) {
  // Eight independent partial sums let the compiler vectorize without -ffast-math.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace serval::kernels::cpu
