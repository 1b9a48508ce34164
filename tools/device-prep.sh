#!/usr/bin/env bash
# Prepares what a device call carries besides the working tree (see tools/gpu-check.sh): the
# PCRE2 and utf8proc headers the GPU machine lacks (.device-deps, packed by
# ../shared/tools/pack-device-deps.sh) and .device-data (the dummy-weight bench configs and the
# GSM8K files that the e2e tests read). Both folders stay out of git. Idempotent.
#
#   tools/device-prep.sh [SHARED_DIR]     (default: ../shared next to the checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${1:-$root/../shared}
cd "$root"
for path in /.device-deps/ /.device-data/ /.clean/ /build*/ /gpu-results/; do
  grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude
done
[[ -d .device-deps/usr ]] || bash "$shared/tools/pack-device-deps.sh" .device-deps
mkdir -p .device-data
cp -r "$shared/bench-configs" .device-data/
# Qwen3-30B-A3B-FP8's shape: the bf16 config with 128 × 128 block FP8 (quant_method "fp8",
# dynamic activations), as Qwen ships it.
fp8=.device-data/bench-configs/qwen3-30b-a3b-fp8
mkdir -p "$fp8"
python3 - .device-data/bench-configs/qwen3-30b-a3b/config.json "$fp8/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                 "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
json.dump(config, open(sys.argv[2], "w"), indent=2)
PY
# DeepSeek shapes for dummy-weight runs: V2-Lite (16B, bf16: the whole model fits one GPU) and
# V3 (671B, 128 × 128 block FP8: `bench moe` times one of its MoE layers).
python3 - .device-data/bench-configs <<'PY'
import json, os, sys
common = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000, "first_k_dense_replace": 1,
          "moe_layer_freq": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_lora_rank": 512}
configs = {
    "deepseek-v2-lite": dict(common, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
        n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1,
        topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
        routed_scaling_factor=1.0, max_position_embeddings=163840,
        rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
    "deepseek-v3-fp8": dict(common, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
        n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
        topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
        routed_scaling_factor=2.5, first_k_dense_replace=3, max_position_embeddings=163840,
        rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                             "weight_block_size": [128, 128]}),
}
for name, config in configs.items():
    os.makedirs(os.path.join(sys.argv[1], name), exist_ok=True)
    json.dump(config, open(os.path.join(sys.argv[1], name, "config.json"), "w"), indent=2)
PY
cp "$shared/data/gsm8k/"*.jsonl .device-data/
echo "device-prep: carry .device-deps and .device-data ($(du -sh .device-data | cut -f1))"
