#!/usr/bin/env bash
# End-to-end: `serval serve --data-parallel-size 2` on the fixture model. Completions work and
# match the single-engine server (greedy), concurrent requests reach both engines, /metrics has
# engine="0" and engine="1" series next to the totals and passes promtool (only the ':' note),
# and afterwards every engine is idle with all its KV blocks free. Then, on the MoE fixture,
# `--data-parallel-size 2 --enable-expert-parallel` (attention data parallel over shared experts,
# CPU) gives one engine's greedy tokens.
# Usage: data_parallel_test.sh SERVAL_BINARY REPO_ROOT
set -euo pipefail
serval=$1
root=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_fixture

complete() {  # complete PORT PROMPT MAX_TOKENS: the completion text
  curl -sf "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"'"$model_name"'","prompt":"'"$2"'","max_tokens":'"$3"',"temperature":0,"ignore_eos":true}' |
    jq -r '.choices[0].text'
}

# Each replica takes its own GPU: with exactly one GPU both replicas run on the CPU instead.
device=()
if [[ $(gpu_count) == 1 ]]; then
  device=(--device cpu)
  echo "note: one GPU visible, so DP=2 is tested on the CPU"
fi

start_server single "$model" --max-model-len 256 "${device[@]}"
single_port=$port
single_pid=$server_pid
model_name=$(curl -sf "http://127.0.0.1:$port/v1/models" | jq -r '.data[0].id')
ref=$(complete "$single_port" "The quick brown fox" 24)
stop_server "$single_pid"

start_server dp2 "$model" --max-model-len 256 --data-parallel-size 2 "${device[@]}"
grep -q "loading replica 1 of 2" "$server_log" || fail "start-up log does not load replica 1"
got=$(complete "$port" "The quick brown fox" 24)
[[ $got == "$ref" ]] || fail "DP=2 completion differs from DP=1: '$got' vs '$ref'"
echo "ok   greedy completion equals the single-engine server"

# Concurrent requests: the second arrives while the first still runs, so it goes to engine 1.
pids=()
for i in $(seq 1 8); do
  complete "$port" "request number $i" 120 >"$work/out$i.txt" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || fail "a concurrent completion failed"; done
for i in $(seq 1 8); do [[ -s $work/out$i.txt ]] || fail "completion $i is empty"; done
echo "ok   8 concurrent completions"

metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
for e in 0 1; do
  line=$(grep -E '^serval:generation_tokens_total\{.*engine="'"$e"'"\}' <<<"$metrics" || true)
  [[ -n $line ]] || fail "/metrics lacks serval:generation_tokens_total for engine=\"$e\""
  [[ ${line##* } -gt 0 ]] || fail "engine $e generated no tokens: $line"
done
total=$(metric serval:generation_tokens_total)
sum=$(grep -E '^serval:generation_tokens_total\{.*engine=' <<<"$metrics" | awk '{s += $NF} END {print s}')
[[ $total == "$sum" ]] || fail "generation_tokens_total $total != sum over engines $sum"
echo "ok   both engines served requests; /metrics has engine=\"0\" and engine=\"1\" and the total"

if command -v promtool >/dev/null; then
  printf '%s\n' "$metrics" >"$work/metrics.txt"
  rc=0
  promtool check metrics <"$work/metrics.txt" >"$work/promtool.out" 2>&1 || rc=$?
  other=$(grep -v "metric names should not contain ':'" "$work/promtool.out" | grep -v '^$' || true)
  if [[ $rc != 0 && $rc != 3 ]] || [[ -n $other ]]; then
    cat "$work/promtool.out"
    fail "promtool check metrics: exit $rc"
  fi
  echo "ok   promtool check metrics (only the ':' naming note)"
else
  echo "skip promtool is not installed"
fi

wait_idle
for _ in $(seq 1 100); do
  page=$(curl -sf "http://127.0.0.1:$port/metrics")
  busy=0
  for e in 0 1; do
    r=$(grep -E '^serval:num_requests_running\{.*engine="'"$e"'"\}' <<<"$page" | awk '{print $NF}')
    f=$(grep -E '^serval:kv_cache_free_blocks\{.*engine="'"$e"'"\}' <<<"$page" | awk '{print $NF}')
    t=$(grep -E '^serval:kv_cache_total_blocks\{.*engine="'"$e"'"\}' <<<"$page" | awk '{print $NF}')
    [[ $r == 0 && -n $f && $f == "$t" ]] || busy=1
  done
  [[ $busy == 0 ]] && break
  sleep 0.1
done
[[ $busy == 0 ]] || fail "an engine is not idle: $(grep -E 'engine=' <<<"$page" | grep -E 'running|free_blocks')"
echo "ok   idle afterwards: 0 running and all KV blocks free on every engine"

stop_server "$server_pid"

# Attention data parallel over shared experts (--data-parallel-size 2 --enable-expert-parallel)
# on the MoE fixture, on the CPU: the greedy tokens of three concurrent id prompts equal one
# engine's.
moe=$root/tests/fixtures/qwen3_moe
moe_ids() {  # moe_ids PORT: the 12-token greedy completions of three id prompts, sent at once
  local i=0
  for prompt in "[11, 200, 37, 5]" "[300, 301, 302, 7, 8, 9, 10]" "[42]"; do
    curl -sf "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
      -d '{"model":"'"$moe"'","prompt":'"$prompt"',"max_tokens":12,"temperature":0,"ignore_eos":true,"logprobs":0}' |
      jq -c '[.choices[0].logprobs.tokens[]]' >"$work/moe$i.txt" &
    i=$((i + 1))
  done
  wait
  cat "$work"/moe0.txt "$work"/moe1.txt "$work"/moe2.txt
}
start_server moe-single "$moe" --device cpu
moe_ref=$(moe_ids "$port")
stop_server "$server_pid"
start_server moe-dp-ep "$moe" --device cpu --data-parallel-size 2 --enable-expert-parallel
grep -q "data parallel 2 with expert parallel" "$server_log" ||
  fail "start-up log does not name data parallel with expert parallel"
got=$(moe_ids "$port")
[[ $got == "$moe_ref" ]] || fail "DP=2 + EP differs from one engine: $got vs $moe_ref"
stop_server "$server_pid"
echo "ok   --data-parallel-size 2 --enable-expert-parallel (MoE fixture, CPU) equals one engine"
echo "PASS data_parallel_test"
