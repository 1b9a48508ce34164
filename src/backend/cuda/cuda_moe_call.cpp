#include "backend/cuda/cuda_moe_call.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/tensor_data.h"

namespace serval::backend::cuda {

MoeCall make_moe_call(Backend& b, const Tensor& x, const MoeWeights& w, Tensor& out,
                      const Tensor& router_logits) {
  const int T = int(x.dim(0)), H = w.hidden, Hp = w.padded_hidden;
  MoeCall c;
  if (Hp != H) {
    c.xp = b.empty(DType::kBF16, {T, Hp});
    c.outp = b.empty(DType::kBF16, {T, Hp});
    b.zero(c.xp);
  }
  moe::MoeCudaArgs& a = c.args;
  a.x = Hp != H ? bf(c.xp) : bf(x);
  a.router_logits = router_logits.as<float>();
  a.out = Hp != H ? bf_mut(c.outp) : bf_mut(out);
  if (w.gate_up_q) {  // NVFP4 or FP8, prepared by prepare_moe
    moe::set_quantized_experts(w, a);
    // W4A4: the activations quantized per expert (set_activation_scale's device scales).
    if (w.gate_up_q->quantize_activations)
      a.gate_up_act_scales = w.gate_up_q->activation_scale.as<float>();
    if (w.down_q->quantize_activations) a.down_act_scales = w.down_q->activation_scale.as<float>();
  } else {
    a.gate_up = bf(w.gate_up);
    a.down = bf(w.down);
  }
  a.num_tokens = T;
  a.num_experts = w.num_experts;
  a.top_k = w.top_k;
  a.hidden = Hp;
  a.inter = w.padded_inter;
  moe::set_moe_routing(w, a);
  a.backend = w.expert_backend == "throughput" ? moe::MoeCudaBackend::kThroughput
                                               : moe::MoeCudaBackend::kLatency;
  const size_t ws = moe::moe_workspace_bytes(T, w.top_k, w.num_local, Hp, w.padded_inter);
  c.workspace = b.empty(DType::kU8, {int64_t(ws)});
  a.workspace = c.workspace.data;
  a.workspace_bytes = ws;
  return c;
}

void pad_moe_input(const Tensor& x, const MoeCall& c, cudaStream_t stream) {
  if (!c.xp.data) return;
  const int T = c.args.num_tokens, H = int(x.dim(-1)), Hp = c.args.hidden;
  cuda_check(cudaMemcpy2DAsync(c.xp.data, Hp * 2, x.data, H * 2, H * 2, T, cudaMemcpyDeviceToDevice,
                               stream),
             "pad moe input");
}

void unpad_moe_output(const MoeCall& c, Tensor& out, cudaStream_t stream) {
  if (!c.outp.data) return;
  const int T = c.args.num_tokens, H = int(out.dim(-1)), Hp = c.args.hidden;
  cuda_check(cudaMemcpy2DAsync(out.data, H * 2, c.outp.data, Hp * 2, H * 2, T,
                               cudaMemcpyDeviceToDevice, stream),
             "unpad moe output");
}

void pad_bf16_experts(Backend& b, MoeWeights& w, cudaStream_t stream) {
  const int H = w.hidden, I = w.inter, Hp = w.padded_hidden, Ip = w.padded_inter;
  if (Hp == H && Ip == I) return;
  // The local experts only: under expert parallel the rank holds num_local of them.
  const int local = int(w.gate_up.dim(0));
  Tensor gate_up = b.empty(DType::kBF16, {local, 2 * Ip, Hp});
  Tensor down = b.empty(DType::kBF16, {local, Hp, Ip});
  b.zero(gate_up);
  b.zero(down);
  for (int e = 0; e < local; ++e) {
    const bf16* src = bf(w.gate_up) + size_t(e) * 2 * I * H;
    bf16* dst = bf_mut(gate_up) + size_t(e) * 2 * Ip * Hp;
    for (int half = 0; half < 2; ++half) {  // gate rows, then up rows
      cuda_check(cudaMemcpy2DAsync(dst + size_t(half) * Ip * Hp, Hp * 2, src + size_t(half) * I * H,
                                   H * 2, H * 2, I, cudaMemcpyDeviceToDevice, stream),
                 "pad gate_up");
    }
    cuda_check(cudaMemcpy2DAsync(bf_mut(down) + size_t(e) * Hp * Ip, Ip * 2,
                                 bf(w.down) + size_t(e) * H * I, I * 2, I * 2, H,
                                 cudaMemcpyDeviceToDevice, stream),
               "pad down");
  }
  w.gate_up = gate_up;
  w.down = down;
}

}  // namespace serval::backend::cuda
