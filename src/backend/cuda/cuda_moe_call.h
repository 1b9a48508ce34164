// The CUDA backend's side of an MoE layer: MoeWeights and step tensors turned into the arguments
// of moe_forward_cuda (backend/moe/moe_cuda.h), with the padding to the experts' device widths.
#pragma once
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/moe/moe_cuda.h"

namespace serval::backend::cuda {

// One moe_forward_cuda call on x [T, H]: the input and output padded to the experts' hidden when
// it differs from the model's (fresh step tensors of `b`; the input's padding zeroed, its rows
// copied in by pad_moe_input), the workspace, and the arguments pointing at them. x / out are
// the caller's when no padding is needed. router_logits: [T, num_experts] f32.
struct MoeCall {
  Tensor xp, outp, workspace;
  moe::MoeCudaArgs args;
};
MoeCall make_moe_call(Backend& b, const Tensor& x, const MoeWeights& w, Tensor& out,
                      const Tensor& router_logits);

// Copies x's rows into the padded input (once x holds them), when the widths differ.
void pad_moe_input(const Tensor& x, const MoeCall& c, cudaStream_t stream);
// Copies the padded output's rows back into out, when the widths differ.
void unpad_moe_output(const MoeCall& c, Tensor& out, cudaStream_t stream);

// bf16 experts: gate_up / down copied into zero-padded tensors of `b` of widths padded_hidden
// and padded_inter (already set in w) when either differs from the model's; unchanged otherwise.
void pad_bf16_experts(Backend& b, MoeWeights& w, cudaStream_t stream);

}  // namespace serval::backend::cuda
