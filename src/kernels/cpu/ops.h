// CPU reference kernels: clear fp32 math, multi-threaded; the oracle of every GPU kernel.
#pragma once

#include <cstdint>
#include "kernels/params.h"

namespace serval::kernels::cpu {

void embedding(const EmbeddingParams& p);
void rms_norm(const RmsNormParams& p);
void linear(const LinearParams& p);
void rope(const RopeParams& p);
void kv_append(const KvAppendParams& p);
void paged_attention(const PagedAttentionParams& p);
void mla_prepare(const MlaPrepareParams& p);
void mla_attention(const MlaAttentionParams& p);
void silu_mul(const SiluMulParams& p);
void sigmoid_gate_add(const SigmoidGateAddParams& p);
void route(const RouterParams& p);

// Converts n elements of a float-typed buffer to fp32.
void to_float(const void* src, DType dtype, float* dst, int64_t n);

}  // namespace serval::kernels::cpu
