// Small bf16 kernels: SiLU-and-mul, the sigmoid-gated add, the plain add and row gathers
// (embedding, logits rows).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace serval::kernels::cuda {

// out[r, i] = silu(gate) · up, fp32 math. tile 0: gate = x[r, i], up = x[r, inter + i];
// tile 16 (a gate/up weight's tiled row order, quant_gemm_gate_up_source_row; inter % 16 == 0):
// gate = x[r, 32·(i / 16) + i % 16], up = the element 16 columns further.
struct SiluMulParams {
  const bf16* x;  // [rows, 2·inter]
  bf16* out;      // [rows, inter]
  int rows, inter;
  int tile = 0;  // 0 or 16
};
void silu_mul(const SiluMulParams& p, cudaStream_t stream);

// out[r, :] += sigmoid(gate[r]) · x[r, :], fp32 math, rounded once to bf16 (a gated shared
// expert's output added to the routed experts' sum, Qwen2-MoE).
struct SigmoidGateAddParams {
  const bf16* gate;  // [rows] (the gate linear's [rows, 1] output)
  const bf16* x;     // [rows, cols]
  bf16* out;         // [rows, cols]
  int rows, cols;
};
void sigmoid_gate_add(const SigmoidGateAddParams& p, cudaStream_t stream);

// out[i] += x[i] for i < n, fp32 math, rounded once to bf16.
struct AddParams {
  const bf16* x;  // [n]
  bf16* out;      // [n]
  int64_t n;
};
void add(const AddParams& p, cudaStream_t stream);

// out[i] = float(x[i]) for i < n.
struct Bf16ToFloatParams {
  const bf16* x;
  float* out;
  int64_t n;
};
void bf16_to_float(const Bf16ToFloatParams& p, cudaStream_t stream);

// out[i] = src[rows[i]] for i < num_rows. Row indices are trusted (the host validates token
// ids against the vocabulary before upload). Serves the embedding lookup and logits gathers.
struct GatherRowsParams {
  const bf16* src;      // [num_src_rows, cols]
  const int32_t* rows;  // [num_rows]
  bf16* out;            // [num_rows, cols]
  int num_rows, cols;
};
void gather_rows(const GatherRowsParams& p, cudaStream_t stream);

// out[t] = table[ids[t]]: gather_rows on the embedding table.
struct EmbeddingParams {
  const bf16* table;   // [vocab, hidden]
  const int32_t* ids;  // [num_tokens], each in [0, vocab)
  bf16* out;           // [num_tokens, hidden]
  int num_tokens, hidden;
};
void embedding(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace serval::kernels::cuda
