#!/usr/bin/env bash
# End-to-end: `serval bench latency` and `serval bench moe` (the README's engine benchmarks) on
# the small fixtures, checking that they run and print their result lines.
# Usage: bench_commands_test.sh SERVAL_BINARY REPO_ROOT
set -euo pipefail
serval=$1
root=$2
model=$root/tests/fixtures/qwen3_moe
[[ -d $model ]] || { echo "SKIP: no fixture ($model)"; exit 0; }

out=$("$serval" bench latency --model "$model" --batch-size 2 --input-len 16 --output-len 8 \
  --num-iters 1 --device cpu 2>&1)
echo "$out"
grep -Eq '^batch 2 input 16 output 8: prefill [0-9.]+ tok/s, TTFT [0-9.]+ ms, TPOT median [0-9.]+ ms' \
  <<<"$out" || { echo "FAIL: no bench latency result line"; exit 1; }

# --async-scheduling: decode steps queued behind each other, their tokens fed back on the device.
out=$("$serval" bench latency --model "$model" --batch-size 2 --input-len 16 --output-len 8 \
  --num-iters 1 --device cpu --async-scheduling 2>&1)
echo "$out"
grep -Eq '^batch 2 input 16 output 8: prefill [0-9.]+ tok/s, TTFT [0-9.]+ ms, TPOT median [0-9.]+ ms' \
  <<<"$out" || { echo "FAIL: no bench latency --async-scheduling result line"; exit 1; }
! grep -q 'no token feedback' <<<"$out" || { echo "FAIL: the runner took steps in turn"; exit 1; }

out=$("$serval" bench moe --config "$model" --tokens 1,8 --iters 2 --device cpu 2>&1)
echo "$out"
[[ $(grep -Ec '^ +(1|8) +[0-9.]+ +[0-9.]+ \|' <<<"$out") == 2 ]] ||
  { echo "FAIL: bench moe did not print one row per token count"; exit 1; }
grep -q '^crossover: ' <<<"$out" || { echo "FAIL: no crossover line"; exit 1; }

# A dummy MoE checkpoint of a real shape with its quantization config, cut to 2 layers so it
# fits any machine: NVFP4 experts on the CPU reference path.
cfgdir=$(mktemp -d)
trap 'rm -rf "$cfgdir"' EXIT
src=$root/../shared/bench-configs/qwen3-30b-a3b-nvfp4
if [[ -d $src ]]; then
  cp "$src"/*.json "$cfgdir"/
  python3 - "$cfgdir/config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["num_hidden_layers"] = 2
json.dump(c, open(p, "w"))
PY
  out=$("$serval" bench moe --config "$cfgdir" --tokens 1 --iters 1 --device cpu 2>&1)
  echo "$out"
  grep -q "NVFP4\|nvfp4" <<<"$out" || { echo "FAIL: bench moe did not report NVFP4 experts"; exit 1; }
fi
echo PASS
