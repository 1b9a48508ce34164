#!/usr/bin/env python3
"""Builds quantized versions of the golden fixtures (run where torch + transformers are).

From tests/fixtures/{llama,qwen3_moe,deepseek_v3} (made by make_fixtures.py) it writes five
checkpoints, each
with its quantization description, the base tokenizer and a golden.json from a PyTorch reference
that runs transformers in fp32 on the dequantized weights (weight-only quantization: activations
are not quantized, as serval runs these checkpoints by default):

  llama_nvfp4_modelopt    NVFP4, ModelOpt layout (hf_quant_config.json), every linear with its own
                          weight_scale_2, so the q/k/v and gate/up shards fuse by re-scaling their
                          block scales to the largest weight_scale_2 (SPEC 2.1; the reference
                          applies the same e4m3 re-rounding); KV scales as k_proj.k_scale /
                          v_proj.v_scale.
  qwen3_moe_nvfp4_ct      NVFP4, compressed-tensors layout (quantization_config in config.json:
                          weight_packed, reciprocal weight_global_scale / input_global_scale), one
                          weight_scale_2 per fused group (no re-scaling); routers ignored by regex;
                          KV scales as k_proj.output_scale / v_proj.output_scale.
  llama_fp8_modelopt      FP8 per-tensor (ModelOpt quant_algo FP8), per-linear weight_scale, so
                          fused shards are re-quantized to the largest scale (e4m3(w·s_i/s_max),
                          as serval does); KV scales as self_attn.k_scale / self_attn.v_scale.
  qwen3_moe_fp8_block     FP8 32×32 blocks (quant_method "fp8", weight_scale_inv), routers and
                          lm_head in ignored_layers; KV scales as self_attn.attn.{k,v}_scale.
  deepseek_v3_fp8_block   FP8 32×32 blocks as DeepSeek-V3 ships them: no ignored_layers (the
                          routers and lm_head are stored unquantized all the same), partial
                          blocks at the edges of q_a_proj's K and kv_a_proj_with_mqa's rows, the
                          MLA, shared-expert and routed-expert linears all quantized; no KV
                          scales.

The KV scales are random values in [0.5, 2]; the goldens use an unquantized KV cache (the
scales only matter for --kv-cache-dtype fp8, which the C++ tests check by loading them). Input
(activation) scales are calibrated on the prompts (amax / (448·6) of each linear's input, as
ModelOpt does). llama_nvfp4_modelopt also gets golden_w4a4.json: the same reference with every
quantized linear's input rounded through NVFP4 by SPEC 2.2 (bf16 input, g = 1/input_scale of the
fused module), which serval must match with --nvfp4-activations; each prompt also records
fragile_from, the first position whose reference depends on fp32 noise (see FRAGILE_MARGIN).

usage: make_quant_fixtures.py --fixtures tests/fixtures [--only NAME,...]
"""
import argparse
import json
import os
import shutil
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

from make_fixtures import greedy  # tools/ is on sys.path when this script runs

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
           "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
# Shards serval fuses into one weight: q/k/v, and gate/up (dense MLP or per expert).
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def e4m3(x):
    """fp32 → e4m3fn value (round to nearest even, saturating at ±448), as fp32."""
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()


def e4m3_bytes(x):
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)


def e2m1_codes(v):
    """Codes (sign << 3 | magnitude index) by SPEC 2.2's round-to-nearest-even thresholds."""
    a = v.abs()
    idx = torch.zeros_like(a, dtype=torch.uint8)
    for threshold, inclusive, code in ((0.25, False, 1), (0.75, True, 2), (1.25, False, 3),
                                       (1.75, True, 4), (2.5, False, 5), (3.5, True, 6),
                                       (5.0, False, 7)):
        idx[(a >= threshold) if inclusive else (a > threshold)] = code
    return idx | ((v < 0).to(torch.uint8) << 3)


def e2m1_values(codes):
    mag = E2M1[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def nvfp4_quantize(w, scale_2):
    """w fp32 [N, K] → (packed u8 [N, K/2], block scales e4m3 bytes [N, K/16], codes)."""
    n, k = w.shape
    blocks = w.reshape(n, k // 16, 16)
    sf = e4m3(blocks.abs().amax(-1) / 6.0 / scale_2)
    denom = (sf * scale_2).unsqueeze(-1)
    scaled = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, 1.0), 0.0)
    codes = e2m1_codes(scaled).reshape(n, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, sf, codes


def nvfp4_dequant(codes, sf, scale_2):
    n, k = codes.shape
    vals = e2m1_values(codes).reshape(n, k // 16, 16)
    return (vals * sf.unsqueeze(-1) * torch.tensor(scale_2, dtype=torch.float32)).reshape(n, k)


def module_groups(names):
    """Linear module names → lists of modules serval fuses together (singletons otherwise)."""
    modules = sorted({n[:-len(".weight")] for n in names
                      if n.endswith(".weight") and n.split(".")[-2] in LINEARS})
    out, seen = [], set()
    for m in modules:
        if m in seen:
            continue
        parent, leaf = m.rsplit(".", 1)
        group = [m]
        for g in GROUPS:
            if leaf in g:
                group = [f"{parent}.{x}" for x in g if f"{parent}.{x}" in modules]
        seen.update(group)
        out.append(group)
    return out


def fake_quant_nvfp4(x, g):
    """SPEC 2.2 on the last dimension of x (bf16 rounding first), dequantized: the values a W4A4
    GEMM multiplies, in the float order serval uses (kernels::cpu::nvfp4_fake_quant_rows)."""
    shape = x.shape
    blocks = x.to(torch.bfloat16).float().reshape(-1, shape[-1] // 16, 16)
    amax = blocks.abs().amax(-1)
    sf = e4m3((g * amax) / 6.0)
    scale = torch.where(sf > 0, g / torch.where(sf > 0, sf, 1.0), 0.0)
    codes = e2m1_codes(blocks * scale.unsqueeze(-1))
    out = e2m1_values(codes) * sf.unsqueeze(-1) / g
    return out.reshape(shape).to(x.dtype)


# A W4A4 reference position is "fragile" when some quantized input row has an element closer than
# this (times the row's RMS) to a bf16 rounding midpoint whose other side changes the row's NVFP4
# value. After the bf16 rounding every SPEC 2.2 step is exact fp32 arithmetic on the same values,
# so this distance is the only place where fp32 noise of ~1e-7 (summation order, exp) between
# transformers and serval can flip a code or a block scale, and one flip cascades through every
# later quantizer (the fixture once hit one 16 ulps from a midpoint: e2m1 0 vs 0.5 in layer 0's
# o_proj input, 0.07-0.15 rel L2 on every later logit row).
FRAGILE_MARGIN = 2e-6


def nvfp4_flip_margins(x, g):
    """Per row of x [..., K] (fp32, K % 16 == 0): min over elements of |x - m| / rms(row), where m
    is the bf16 midpoint between the two bf16 neighbours of x, counted only where rounding to the
    other neighbour changes fake_quant_nvfp4 of the row (the element's code or its block's scale);
    inf where no element can. Shape x.shape[:-1]."""
    shape = x.shape
    k = shape[-1]
    xf = x.float().reshape(-1, k // 16, 16)
    bits = xf.contiguous().view(torch.int32)
    low = (bits & -65536).view(torch.float32)  # bf16 neighbour nearer zero (truncation)
    high = ((bits & -65536) + 65536).view(torch.float32)  # the other one (larger magnitude)
    mid = ((bits & -65536) | 32768).view(torch.float32)  # exact midpoint of the two
    b = xf.to(torch.bfloat16).float()
    alt = torch.where(b == low, high, low)
    amax = b.abs().amax(-1)
    sf = e4m3((g * amax) / 6.0)
    scale = torch.where(sf > 0, g / torch.where(sf > 0, sf, 1.0), 0.0)
    # Block amax with element j rounded the other way: the runner-up covers ties and the element
    # that is the amax itself.
    top2 = b.abs().topk(2, dim=-1).values
    is_max = b.abs() == amax.unsqueeze(-1)
    amax_alt = torch.where(is_max, torch.maximum(alt.abs(), top2[..., 1:2]),
                           torch.maximum(alt.abs(), amax.unsqueeze(-1)))
    sf_alt = e4m3((g * amax_alt) / 6.0)
    code = e2m1_codes(b * scale.unsqueeze(-1)) & 7
    code_alt = e2m1_codes(alt * scale.unsqueeze(-1)) & 7
    matters = (sf_alt != sf.unsqueeze(-1)) | ((sf.unsqueeze(-1) > 0) & (code_alt != code))
    rms = xf.reshape(-1, k).pow(2).mean(-1).sqrt().clamp_min(1e-30)
    dist = torch.where(matters, (xf - mid).abs(), torch.tensor(float("inf")))
    return (dist.reshape(-1, k).amin(-1) / rms).reshape(shape[:-1])


@torch.no_grad()
def calibrate_input_scales(base_dir, model_cls, prompts):
    """{module: amax of its input over the prompts / (448·6)} for every nn.Linear."""
    model = getattr(transformers, model_cls).from_pretrained(base_dir, torch_dtype=torch.float32)
    amax, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def hook(mod, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
            hooks.append(module.register_forward_pre_hook(hook))
    for prompt in prompts:
        model(torch.tensor([prompt]))
    for h in hooks:
        h.remove()
    return {m: max(a, 1e-6) / (448.0 * 6.0) for m, a in amax.items()}


def quantize_nvfp4(state, groups, shared_scale, ct, input_scales):
    """Quantizes every linear in place of `state`; returns {module: dequantized fp32 weight}."""
    deq = {}
    for group in groups:
        ws = {m: state.pop(f"{m}.weight").float() for m in group}
        amaxes = {m: float(w.abs().max()) for m, w in ws.items()}
        if shared_scale:
            s = max(amaxes.values()) / (448.0 * 6.0)
            scales = {m: s for m in group}
        else:
            scales = {m: amaxes[m] / (448.0 * 6.0) for m in group}
        scales = {m: float(torch.tensor(s if s > 0 else 1.0, dtype=torch.float32))
                  for m, s in scales.items()}
        s_max = max(scales.values())
        for m in group:
            packed, sf, codes = nvfp4_quantize(ws[m], scales[m])
            input_scale = input_scales.get(m, float(torch.rand(()) * 0.01 + 0.005))
            state[f"{m}.{'weight_packed' if ct else 'weight'}"] = packed.contiguous()
            state[f"{m}.weight_scale"] = e4m3_bytes(sf).view(torch.float8_e4m3fn).contiguous()
            if ct:
                state[f"{m}.weight_global_scale"] = torch.tensor(1.0 / scales[m])
                state[f"{m}.input_global_scale"] = torch.tensor(1.0 / input_scale)
            else:
                state[f"{m}.weight_scale_2"] = torch.tensor(scales[m])
                state[f"{m}.input_scale"] = torch.tensor(input_scale)
            # serval's fused weight: block scales re-rounded to the group's largest scale_2.
            if len(group) > 1 and scales[m] != s_max:
                ratio = torch.tensor(scales[m], dtype=torch.float32) / torch.tensor(
                    s_max, dtype=torch.float32)
                sf = e4m3(sf * ratio)
            deq[m] = nvfp4_dequant(codes, sf, s_max if len(group) > 1 else scales[m])
    return deq


def quantize_fp8_tensor(state, groups, input_scales):
    deq = {}
    for group in groups:
        ws = {m: state.pop(f"{m}.weight").float() for m in group}
        scales = {m: float(torch.tensor(max(float(w.abs().max()), 1e-12) / 448.0,
                                        dtype=torch.float32)) for m, w in ws.items()}
        s_max = max(scales.values())
        for m in group:
            q = e4m3(ws[m] / scales[m])
            state[f"{m}.weight"] = q.to(torch.float8_e4m3fn)
            state[f"{m}.weight_scale"] = torch.tensor(scales[m])
            state[f"{m}.input_scale"] = torch.tensor(
                input_scales.get(m, float(torch.rand(()) * 0.01 + 0.005)))
            s = torch.tensor(scales[m], dtype=torch.float32)
            if scales[m] != s_max:  # serval re-quantizes the shard: e4m3(w · s_i / s_max)
                q = e4m3(q * s / torch.tensor(s_max, dtype=torch.float32))
                s = torch.tensor(s_max, dtype=torch.float32)
            deq[m] = q * s
    return deq


def quantize_fp8_block(state, groups, block):
    """Block FP8 of every linear in `groups`; a shape that is not a multiple of `block` ends in
    partial blocks, whose scales cover their real elements only (scales [ceil(n/b), ceil(k/b)])."""
    deq = {}
    for group in groups:
        for m in group:
            w = state.pop(f"{m}.weight").float()
            n, k = w.shape
            nb, kb = -(-n // block), -(-k // block)
            padded = torch.zeros(nb * block, kb * block)
            padded[:n, :k] = w
            tiles = padded.reshape(nb, block, kb, block)
            scale = (tiles.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
            q = e4m3(tiles / scale[:, None, :, None]).reshape(nb * block, kb * block)[:n, :k]
            state[f"{m}.weight"] = q.contiguous().to(torch.float8_e4m3fn)
            state[f"{m}.weight_scale_inv"] = scale.contiguous()
            per_element = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]
            deq[m] = q * per_element
    return deq


def add_kv_scales(state, num_layers, k_name, v_name):
    for i in range(num_layers):
        state[f"model.layers.{i}.{k_name}"] = torch.tensor(float(torch.rand(()) * 1.5 + 0.5))
        state[f"model.layers.{i}.{v_name}"] = torch.tensor(float(torch.rand(()) * 1.5 + 0.5))


def write_golden(base_dir, folder, base_state, deq, model_cls, prompts, act_scales=None):
    """Reference: transformers in fp32 on a temporary checkpoint holding the dequantized weights
    under the base fixture's names (transformers maps them to its own module layout). With
    act_scales ({module: g}), each of those linears fake-quantizes its input first (W4A4)."""
    ref_state = {k: v.float() for k, v in base_state.items()}
    for m, w in deq.items():
        ref_state[f"{m}.weight"] = w.float().contiguous()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(base_dir, "config.json")) as f:
            config = json.load(f)
        config["torch_dtype"] = config["dtype"] = "float32"
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f)
        save_file(ref_state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        ref = getattr(transformers, model_cls).from_pretrained(tmp, torch_dtype=torch.float32)
        ref = ref.eval()
        # probe["margin"]: per position of the prompt being scored, the smallest flip margin
        # (nvfp4_flip_margins) over every quantized linear's input; None outside that forward.
        probe = {"margin": None}

        def quantize_input(mod, args, g):
            if probe["margin"] is not None:
                probe["margin"] = torch.minimum(probe["margin"], nvfp4_flip_margins(args[0], g)[0])
            return (fake_quant_nvfp4(args[0], g),)

        for name, module in ref.named_modules():
            if act_scales and name in act_scales:
                g = act_scales[name]
                module.register_forward_pre_hook(lambda mod, args, g=g: quantize_input(mod, args, g))
        golden = {"architecture": model_cls, "transformers": transformers.__version__,
                  "prompts": [], "weight_keys": None}
        for prompt in prompts:
            probe["margin"] = torch.full((len(prompt),), float("inf")) if act_scales else None
            with torch.no_grad():
                logits = ref(torch.tensor([prompt])).logits[0].float()
            margin, probe["margin"] = probe["margin"], None
            cont, margins = greedy(ref, prompt, 32)
            entry = {"ids": prompt, "logits": logits.tolist(), "greedy": cont,
                     "greedy_margins": margins}
            if act_scales:
                # Positions from the first fragile one on depend on fp32 noise (causal attention
                # carries a flip to every later position); serval's test compares those before.
                fragile = (margin < FRAGILE_MARGIN).nonzero()
                entry["fragile_from"] = int(fragile[0]) if len(fragile) else len(prompt)
                entry["flip_margins"] = margin.tolist()
            golden["prompts"].append(entry)
    return golden


VARIANTS = {
    "llama_nvfp4_modelopt": ("llama", "nvfp4_modelopt",
                             ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")),
    "qwen3_moe_nvfp4_ct": ("qwen3_moe", "nvfp4_ct",
                           ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale")),
    "llama_fp8_modelopt": ("llama", "fp8_modelopt", ("self_attn.k_scale", "self_attn.v_scale")),
    "qwen3_moe_fp8_block": ("qwen3_moe", "fp8_block",
                            ("self_attn.attn.k_scale", "self_attn.attn.v_scale")),
    "deepseek_v3_fp8_block": ("deepseek_v3", "fp8_block_deepseek", None),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--only", help="comma-separated variant names (default: all)")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else set(VARIANTS)
    unknown = only - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; choices: {sorted(VARIANTS)}")
    for name, (base, scheme, kv_names) in VARIANTS.items():
        if name not in only:
            continue
        torch.manual_seed(sum(map(ord, name)))
        base_dir = os.path.join(args.fixtures, base)
        folder = os.path.join(args.fixtures, name)
        os.makedirs(folder, exist_ok=True)
        base_state = load_file(os.path.join(base_dir, "model.safetensors"))
        with open(os.path.join(base_dir, "golden.json")) as f:
            base_golden = json.load(f)
        prompts = [p["ids"] for p in base_golden["prompts"]]
        with open(os.path.join(base_dir, "config.json")) as f:
            config = json.load(f)
        num_layers = config["num_hidden_layers"]
        state = dict(base_state)
        groups = module_groups(state.keys())
        input_scales = calibrate_input_scales(base_dir, base_golden["architecture"], prompts)
        routers = sorted(k[:-len(".weight")] for k in state if k.endswith(".mlp.gate.weight"))
        if scheme == "nvfp4_modelopt":
            deq = quantize_nvfp4(state, groups, shared_scale=False, ct=False,
                                 input_scales=input_scales)
            quant_file = {"producer": {"name": "modelopt"},
                          "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                           "kv_cache_quant_algo": "FP8",
                                           "exclude_modules": ["lm_head"]}}
        elif scheme == "nvfp4_ct":
            deq = quantize_nvfp4(state, groups, shared_scale=True, ct=True,
                                 input_scales=input_scales)
            quant_file = None
            config["quantization_config"] = {
                "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"type": "float", "num_bits": 4, "strategy": "tensor_group",
                                "group_size": 16, "symmetric": True, "dynamic": False},
                    "input_activations": {"type": "float", "num_bits": 4,
                                          "strategy": "tensor_group", "group_size": 16,
                                          "symmetric": True, "dynamic": "local"}}},
                "ignore": ["lm_head", "re:.*mlp\\.gate$"],
                "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor",
                                    "dynamic": False, "symmetric": True}}
        elif scheme == "fp8_modelopt":
            deq = quantize_fp8_tensor(state, groups, input_scales)
            quant_file = {"producer": {"name": "modelopt"},
                          "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                                           "exclude_modules": ["lm_head"]}}
        else:
            deq = quantize_fp8_block(state, groups, 32)
            quant_file = None
            config["quantization_config"] = {
                "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [32, 32]}
            if scheme == "fp8_block":
                config["quantization_config"]["ignored_layers"] = routers + ["lm_head"]
        if kv_names:
            add_kv_scales(state, num_layers, *kv_names)
        save_file({k: v.contiguous() for k, v in state.items()},
                  os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        if quant_file is not None:
            with open(os.path.join(folder, "hf_quant_config.json"), "w") as f:
                json.dump(quant_file, f, indent=2)
        for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(os.path.join(base_dir, extra), os.path.join(folder, extra))
        golden = write_golden(base_dir, folder, base_state, deq, base_golden["architecture"],
                              prompts)
        golden["weight_keys"] = sorted(state.keys())
        golden["quantization"] = scheme
        with open(os.path.join(folder, "golden.json"), "w") as f:
            json.dump(golden, f)
        if scheme == "nvfp4_modelopt":
            # serval quantizes a fused module's input with the largest input_scale of its shards.
            act = {}
            for group in groups:
                s_max = max(float(state[f"{m}.input_scale"]) for m in group)
                g = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(s_max, dtype=torch.float32)
                act.update({m: g for m in group})
            w4a4 = write_golden(base_dir, folder, base_state, deq, base_golden["architecture"],
                                prompts, act_scales=act)
            w4a4["quantization"] = scheme + " + nvfp4 activations"
            with open(os.path.join(folder, "golden_w4a4.json"), "w") as f:
                json.dump(w4a4, f)
        print(name, "tensors", len(state), "quantized modules", len(deq),
              "min margins", [round(min(p["greedy_margins"]), 4) for p in golden["prompts"]])


if __name__ == "__main__":
    main()
