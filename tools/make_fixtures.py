#!/usr/bin/env python3
"""Builds the tiny golden-test checkpoints under tests/fixtures/ (run where torch + transformers are).

For each architecture: a random model with real config keys (deterministic seed), saved with
save_pretrained (safetensors) in a chosen dtype, a small byte-level BPE tokenizer trained on GSM8K
text (shared by all fixtures), and golden.json with reference logits (fp32 math, all positions)
for a few prompts and a 32-token greedy continuation of each, with the top-1/top-2 logit margin
of every greedy step (a near-tie cannot be expected to match bit for bit).

usage: make_fixtures.py --gsm8k PATH/train.jsonl --out tests/fixtures [--only qwen2,qwen2_moe]
       make_fixtures.py --tokenizer tests/fixtures/llama/tokenizer.json --out DIR --only qwen2
       (--tokenizer: the fixtures' tokenizer as it is, instead of training it again)
"""
import argparse
import json
import os

import torch
import transformers

from bpe_tokenizer import CHAT_TEMPLATE, train_bpe  # tools/ is on sys.path

VOCAB = 512


def train_tokenizer(gsm8k_path):
    texts = []
    with open(gsm8k_path) as f:
        for i, line in enumerate(f):
            if i >= 2000:
                break
            item = json.loads(line)
            texts.append(f"Question: {item['question']}\nAnswer: {item['answer']}\n\n")
    return train_bpe(texts, VOCAB)


def base_config(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0,
               bos_token_id=None, eos_token_id=0, tie_word_embeddings=False)
    cfg.update(kw)
    if cfg["head_dim"] is None:  # left to the architecture's own rule
        del cfg["head_dim"]
    return cfg


ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", torch.bfloat16,
              base_config(rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", torch.float32,
              base_config(tie_word_embeddings=True, rope_theta=1000000.0)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", torch.bfloat16,
                  base_config(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[2],
                              rope_theta=1000000.0)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", torch.float16,
                base_config(num_local_experts=4, num_experts_per_tok=2, intermediate_size=96,
                            rope_theta=1000000.0)),
    # Biases on q, k and v (not o); the window is off, as in Qwen2.5's configs.
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", torch.bfloat16,
              base_config(tie_word_embeddings=True, rope_theta=1000000.0,
                          use_sliding_window=False, sliding_window=4096)),
    # Qwen2's attention, routed experts not renormalized, a sigmoid-gated shared expert; layer 2
    # dense.
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", torch.bfloat16,
                  base_config(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                              shared_expert_intermediate_size=48, norm_topk_prob=False,
                              decoder_sparse_step=1, mlp_only_layers=[2], rope_theta=1000000.0,
                              use_sliding_window=False, sliding_window=4096)),
    # Qwen3 with YaRN: a ramp over the dimensions between the correction bounds of a 64-token
    # original context (head_dim 16, theta 10000: dimensions 0 to 2), attention factor 1.139.
    "qwen3_yarn": ("Qwen3Config", "Qwen3ForCausalLM", torch.bfloat16,
                   base_config(rope_theta=10000.0,
                               rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 64})),
    # Phi-3: Llama's layers with one qkv_proj and one gate_up_proj per layer.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", torch.bfloat16,
             base_config(pad_token_id=0, rope_theta=10000.0)),
    # Llama with attention_bias: biases on q, k, v and o.
    "llama_bias": ("LlamaConfig", "LlamaForCausalLM", torch.bfloat16,
                   base_config(attention_bias=True, rope_theta=500000.0)),
    # DeepSeek-V3: multi-head latent attention (q through a rank-48 bottleneck, keys and values
    # from a rank-32 latent plus an 8-wide rotary key shared by the heads, interleaved rotary
    # dimensions, DeepSeek's YaRN whose mscale_all_dim scales the softmax), layer 0 dense, then
    # 8 routed experts in 4 groups (sigmoid scores, selection bias, top-2 groups, top-2 experts,
    # renormalized and scaled by 2.5) beside one shared expert. head_dim is the rotary width
    # there (transformers sets it so): left out.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", torch.bfloat16,
                    base_config(head_dim=None, num_key_value_heads=4, q_lora_rank=48,
                                kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                v_head_dim=16, n_routed_experts=8, n_shared_experts=1,
                                num_experts_per_tok=2, moe_intermediate_size=32, n_group=4,
                                topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                                first_k_dense_replace=1, rope_theta=10000.0,
                                rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64,
                                              "mscale": 1.0, "mscale_all_dim": 1.0,
                                              "beta_fast": 32.0, "beta_slow": 1.0})),
    # DeepSeek-V2-Lite's shape: q from one q_proj (no bottleneck), softmax routing, top-2 of 8
    # experts not renormalized and scaled by 1.5, two shared experts, no rope scaling.
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", torch.bfloat16,
                    base_config(head_dim=None, num_key_value_heads=4, q_lora_rank=None,
                                kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                v_head_dim=16, n_routed_experts=8, n_shared_experts=2,
                                num_experts_per_tok=2, moe_intermediate_size=32,
                                topk_method="greedy", routed_scaling_factor=1.5,
                                norm_topk_prob=False, first_k_dense_replace=1,
                                rope_theta=10000.0)),
}


@torch.no_grad()
def greedy(model, prompt, steps):
    ids = list(prompt)
    margins = []
    for _ in range(steps):
        logits = model(torch.tensor([ids])).logits[0, -1].double()
        top2 = torch.topk(logits, 2)
        margins.append(float(top2.values[0] - top2.values[1]))
        ids.append(int(top2.indices[0]))
    return ids[len(prompt):], margins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gsm8k")
    ap.add_argument("--tokenizer", help="an existing fixture tokenizer.json, used as it is")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()
    if args.tokenizer:
        import tokenizers
        tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    elif args.gsm8k:
        tok = train_tokenizer(args.gsm8k)
    else:
        ap.error("one of --gsm8k and --tokenizer is needed")
    only = set(args.only.split(",")) if args.only else set(ARCHS)
    unknown = only - set(ARCHS)
    if unknown:
        ap.error(f"unknown fixtures {sorted(unknown)} (known: {sorted(ARCHS)})")
    gen = torch.Generator().manual_seed(1234)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 11, 17)]
    prompts.append(tok.encode("Question: Tom has 3 apples and buys 5 more. How many?\nAnswer:").ids)
    for name, (cfg_cls, model_cls, dtype, cfg) in ARCHS.items():
        if name not in only:
            continue
        torch.manual_seed(sum(map(ord, name)))
        config = getattr(transformers, cfg_cls)(**cfg)
        config.torch_dtype = dtype
        model = getattr(transformers, model_cls)(config).to(dtype).eval()
        # Widen the random init so logits are not all near zero (clearer argmax margins).
        # Biases too (initialized to zero, a missing bias would go unnoticed).
        for pname, p in model.named_parameters():
            if p.dim() >= 2:
                p.data.normal_(0.0, 0.08, generator=torch.Generator().manual_seed(p.numel()))
            elif pname.endswith(".bias"):
                p.data.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(p.numel() + 1))
        # DeepSeek's expert-selection bias is a buffer, zero at init (it would go unnoticed).
        # Small, as in the real checkpoints: sigmoid scores plus it stay positive, so the
        # reference's zeros for experts of unselected groups never outrank a selectable one.
        for bname, buf in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                buf.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(buf.numel() + 2))
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        model.generation_config.save_pretrained(folder)
        tok.save(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": None, "eos_token": "<|endoftext|>",
                       "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE,
                       "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"},
                      f, indent=2)
        # Reference in fp32 from the saved (rounded) weights.
        ref = getattr(transformers, model_cls).from_pretrained(folder, torch_dtype=torch.float32)
        ref = ref.eval()
        golden = {"architecture": model_cls, "transformers": transformers.__version__,
                  "prompts": [], "weight_keys": None}
        for prompt in prompts:
            with torch.no_grad():
                logits = ref(torch.tensor([prompt])).logits[0].float()
            cont, margins = greedy(ref, prompt, 32)
            golden["prompts"].append({"ids": prompt, "logits": logits.tolist(),
                                      "greedy": cont, "greedy_margins": margins})
        from safetensors import safe_open
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
            golden["weight_keys"] = sorted(f.keys())
        with open(os.path.join(folder, "golden.json"), "w") as f:
            json.dump(golden, f)
        print(name, "params", sum(p.numel() for p in model.parameters()),
              "keys", len(golden["weight_keys"]), golden["weight_keys"][:12],
              "min margins", [min(p["greedy_margins"]) for p in golden["prompts"]])


if __name__ == "__main__":
    main()
