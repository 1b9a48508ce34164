#!/usr/bin/env bash
# End-to-end, two GPUs: tensor- and expert-parallel start-up of a Qwen3-30B-A3B-shaped MoE model
# (the real layer shapes, 2 layers, dummy weights) with CUDA graphs for decode batches up to 16
# and 64 finishes and runs, and so do eager steps and long prefills after it. Written after such a
# start-up hung in the decode-graph warm-up (bench/RESULTS.md, 2026-11-30: GPU 0 spinning in a
# collective, GPU 1 idle); each run is bounded by `timeout`, so a hang fails the test instead of
# stalling the suite.
# Usage: parallel_startup_test.sh SERVAL_BINARY REPO_ROOT
set -euo pipefail
serval=$1
# shellcheck disable=SC2034  # lib.sh reads it
root=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
[[ $(gpu_count) -ge 2 ]] || skip "needs two CUDA GPUs"
export NCCL_NVLS_ENABLE=0

# Qwen3-30B-A3B's config.json with 2 of its 48 layers.
qwen3=$work/qwen3-30b-a3b-2-layers
mkdir -p "$qwen3"
cat >"$qwen3/config.json" <<'EOF'
{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
  "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 2,
  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "attention_bias": false, "hidden_act": "silu", "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "rope_scaling": null, "max_position_embeddings": 40960,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 151936,
  "bos_token_id": 151643, "eos_token_id": 151645
}
EOF

# run LABEL ARGS...: one `bench latency` that must finish within $limit seconds (with decode graphs
# unless ARGS has --enforce-eager).
limit=${SERVAL_E2E_RUN_TIMEOUT:-120}
run() {
  local label=$1
  shift
  local log=$work/run.log rc=0
  local lengths=(--input-len 32 --output-len 4)
  [[ " $* " == *" --input-len "* ]] && lengths=()
  timeout -k 10 "$limit" "$serval" bench latency --model "$qwen3" --load-format dummy --num-iters 1 \
    "${lengths[@]}" "$@" >"$log" 2>&1 || rc=$?
  if [[ $rc != 0 ]]; then
    tail -n 20 "$log" >&2
    [[ $rc == 124 || $rc == 137 ]] && fail "$label: still running after $limit s (hang)"
    fail "$label: exit $rc"
  fi
  [[ " $* " == *" --enforce-eager "* ]] || grep -q "captured" "$log" ||
    fail "$label: no decode graphs captured"
  echo "ok   $label"
}

# Batch 8, then the eager run: kernels whose first launch is in a step with the ranks'
# collectives in flight (the prefill's GEMMs, attention and MoE stages; every kernel when eager).
run "TP=2 batch 8" --tensor-parallel-size 2 --batch-size 8
run "TP=2 eager batch 16" --tensor-parallel-size 2 --batch-size 16 --enforce-eager
# Long prompts after the graphs: the prefill's large GEMMs (timed on first use), attention and
# MoE throughput kernels first run inside a step whose collectives are in flight.
run "TP=2 prefill 2 x 4000" --tensor-parallel-size 2 --batch-size 2 --input-len 4000 \
  --output-len 2
run "TP=2 + EP prefill 2 x 4000" --tensor-parallel-size 2 --enable-expert-parallel \
  --batch-size 2 --input-len 4000 --output-len 2
for batch in 16 64; do
  run "TP=2 batch $batch" --tensor-parallel-size 2 --batch-size "$batch"
  run "TP=2 + EP batch $batch" --tensor-parallel-size 2 --enable-expert-parallel \
    --batch-size "$batch"
done
