#!/usr/bin/env bash
# On the GPU machine, after tools/gpu-check.sh built build-gpu (e.g. its --then): the one-token
# fused NVFP4 MoE kernel (kernels/cuda/moe/moe_one_token_nvfp4.h) end to end. Its tests and those
# of the three kernels it replaces, at 16 and 8 warps per CTA; its benchmark against the three
# kernels with the per-phase %globaltimer breakdown; Qwen3-30B-A3B NVFP4 batch-1 TPOT with the
# three kernels and with the fused kernel at 16 and 8 warps.
#
#   tools/moe-one-token-check.sh [CONFIGS_DIR]     (default .device-data/bench-configs)
set -u
serval=build-gpu/apps/serval
tests=build-gpu/tests/kernels_gpu
configs=${1:-.device-data/bench-configs}
echo "== MoeNvfp4Gpu, MoeOneTokenNvfp4 (16 warps)"
timeout 90 "$tests" --gtest_filter='MoeNvfp4Gpu.*:MoeOneTokenNvfp4.*' 2>&1 |
  grep -E "^experts|strips|Failure|OK \]|FAILED|PASSED" | head -60
echo "== MoeOneTokenNvfp4 (8 warps)"
SERVAL_MOE_ONE_TOKEN_WARPS=8 timeout 60 "$tests" --gtest_filter='MoeOneTokenNvfp4.*' 2>&1 |
  grep -E "Failure|OK \]|FAILED|PASSED" | head -20
for warps in 16 8; do
  echo "== benchmark, $warps warps"
  SERVAL_MOE_ONE_TOKEN_WARPS=$warps timeout 60 "$tests" --gtest_also_run_disabled_tests \
    --gtest_filter='MoeOneTokenNvfp4.DISABLED_Bench*' 2>&1 | grep -vE "^\[|^$|Note:" | head -16
done
echo "== Qwen3-30B-A3B NVFP4, batch 1, TPOT"
for envs in "SERVAL_MOE_ONE_TOKEN_FUSED=0" \
  "SERVAL_MOE_ONE_TOKEN_FUSED=1 SERVAL_MOE_ONE_TOKEN_WARPS=16" \
  "SERVAL_MOE_ONE_TOKEN_FUSED=1 SERVAL_MOE_ONE_TOKEN_WARPS=8"; do
  echo "-- $envs"
  # shellcheck disable=SC2086
  env $envs timeout 60 "$serval" bench latency --model "$configs/qwen3-30b-a3b-nvfp4" \
    --load-format dummy --kv-cache-dtype fp8 --num-iters 3 --batch-size 1 --input-len 128 \
    --output-len 32 2>&1 | grep -E "TPOT|rror"
done
