#!/usr/bin/env bash
# End-to-end: `serval serve` on the fixture model through the openai npm client (server_openai.mjs),
# MoE backend selection at run time, greedy output == `serval generate`, promtool on /metrics,
# an embedding model (--runner pooling) through the client, the vLLM reference command line,
# SIGTERM with a request in flight, and speculative decoding's greedy ids.
# Usage: server_openai_test.sh SERVAL_BINARY REPO_ROOT
set -euo pipefail
serval=$1
root=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_fixture

# --- The default backend in effect at run time: neither flag nor environment variable. ---
start_server default "$model"
env_port=$port
default_pid=$server_pid
default_log=$server_log
models=$(curl -sf "http://127.0.0.1:$port/v1/models")
[[ $(jq -r '.data[0].serval.moe_backend' <<<"$models") == latency ]] ||
  fail "default moe_backend is not latency: $models"
max_model_len=$(jq -r '.data[0].max_model_len' <<<"$models")
model_name=$(jq -r '.data[0].id' <<<"$models")
# (Whole pages into variables first: `curl | grep -q` fails under pipefail when grep exits early.)
metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
grep -Fq 'serval:moe_backend_info{model_name="'"$model_name"'",backend="latency"} 1' <<<"$metrics" ||
  fail "/metrics lacks serval:moe_backend_info backend=latency"
grep -q "MoE backend latency" "$default_log" || fail "start-up log does not name the MoE backend"
echo "ok   default MoE backend is latency (/v1/models, /metrics, log); max_model_len $max_model_len"

# --- The openai client. ---
if command -v node >/dev/null && [[ -f $npm_modules/openai/index.mjs ]]; then
  node "$here/server_openai.mjs" "http://127.0.0.1:$port/v1" "$npm_modules" latency ||
    fail "openai client checks failed"
else
  echo "SKIP: openai client checks (node or $npm_modules/openai missing)"
fi

# --- Greedy output through the server equals `serval generate`. ---
for prompt_ids in "1,2,3,4" "17,250,3,99,42,7,311"; do
  gen_out=$(env -u SERVAL_MOE_BACKEND "$serval" generate "$model" --prompt-ids "$prompt_ids" \
    --max-tokens 24 --ignore-eos 2>"$work/generate.err") || {
    cat "$work/generate.err"
    fail "serval generate failed"
  }
  gen_ids=$(sed -n 's/^ids: //p' <<<"$gen_out")
  body=$(jq -nc --arg ids "$prompt_ids" \
    '{prompt: ($ids | split(",") | map(tonumber)), max_tokens: 24, temperature: 0,
      ignore_eos: true, logprobs: 0, return_tokens_as_token_ids: true}')
  resp=$(curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' -d "$body")
  srv_ids=$(jq -r '.choices[0].logprobs.tokens | map(ltrimstr("token_id:")) | join(",")' <<<"$resp")
  [[ $srv_ids == "$gen_ids" ]] || fail "prompt $prompt_ids: server ids $srv_ids != generate ids $gen_ids"
  [[ -n ${latency_ids:-} ]] || latency_ids=$gen_ids
  # And the text: the server's incremental detokenization equals a whole-sequence decode.
  want_text=$(curl -sf "http://127.0.0.1:$port/detokenize" -d "{\"tokens\":[$gen_ids]}" | jq -r .prompt)
  [[ $(jq -r '.choices[0].text' <<<"$resp") == "$want_text" ]] || fail "prompt $prompt_ids: text differs"
done
echo "ok   greedy server output == serval generate (token ids and text)"

# --- promtool: only the complaint about ':' in serval: names is accepted. ---
if command -v promtool >/dev/null; then
  curl -sf "http://127.0.0.1:$port/metrics" >"$work/metrics.txt"
  rc=0
  promtool check metrics <"$work/metrics.txt" >"$work/promtool.out" 2>&1 || rc=$?
  other=$(grep -v "metric names should not contain ':'" "$work/promtool.out" | grep -v '^$' || true)
  if [[ $rc != 0 && $rc != 3 ]] || [[ -n $other ]]; then
    cat "$work/promtool.out"
    fail "promtool check metrics: exit $rc"
  fi
  grep -Fq "serval:num_requests_running metric names should not contain ':'" "$work/promtool.out" ||
    [[ $rc == 0 ]] || fail "unexpected promtool output"
  echo "ok   promtool check metrics (exit $rc, only the ':' naming complaint)"
else
  echo "SKIP: promtool not installed"
fi

# --- SIGTERM with requests in flight: exit 0 within a few seconds, clients see the end. ---
long=$((max_model_len - 8))
curl_pids=()
for i in 1 2 3; do
  curl -sN "http://127.0.0.1:$env_port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":[1,2,3],\"max_tokens\":$long,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" \
    >"$work/inflight$i.out" 2>/dev/null &
  curl_pids+=($!)
done
for _ in $(seq 1 200); do
  [[ -s $work/inflight1.out ]] && break
  sleep 0.01
done
[[ -s $work/inflight1.out ]] || fail "no streamed bytes before SIGTERM"
grep -q '\[DONE\]' "$work/inflight3.out" && echo "note: request 3 finished before SIGTERM"
t0=$(date +%s.%N)
stop_server "$default_pid"
t1=$(date +%s.%N)
wait "${curl_pids[@]}"
elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
for i in 1 2 3; do
  [[ $(tail -c 200 "$work/inflight$i.out") == *"data: [DONE]"* ]] ||
    fail "in-flight stream $i did not end with [DONE]: $(tail -c 300 "$work/inflight$i.out")"
done
awk -v e="$elapsed" 'BEGIN { exit !(e < 5) }' || fail "SIGTERM took $elapsed s"
grep -q "shutting down" "$default_log" || fail "no shutdown line in the log"
echo "ok   SIGTERM with requests in flight: exit 0 after ${elapsed} s"

# --- SERVAL_MOE_BACKEND=throughput, and the flag beats the variable. ---
SERVAL_MOE_BACKEND=throughput start_server env_throughput "$model"
[[ $(curl -sf "http://127.0.0.1:$port/v1/models" | jq -r '.data[0].serval.moe_backend') == throughput ]] ||
  fail "SERVAL_MOE_BACKEND=throughput not in effect"
metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
grep -q 'serval:moe_backend_info{.*backend="throughput"} 1' <<<"$metrics" ||
  fail "/metrics lacks backend=throughput"
curl -sf "http://127.0.0.1:$port/v1/completions" -d '{"prompt":[1,2,3,4],"max_tokens":24,"temperature":0,"ignore_eos":true,"logprobs":0,"return_tokens_as_token_ids":true}' |
  jq -r '.choices[0].logprobs.tokens | map(ltrimstr("token_id:")) | join(",")' >"$work/throughput.ids"
[[ $(cat "$work/throughput.ids") == "$latency_ids" ]] ||
  fail "greedy ids differ between backends: throughput $(cat "$work/throughput.ids"), latency $latency_ids"
stop_server "$server_pid"
SERVAL_MOE_BACKEND=throughput start_server flag_latency "$model" --moe-backend latency
[[ $(curl -sf "http://127.0.0.1:$port/v1/models" | jq -r '.data[0].serval.moe_backend') == latency ]] ||
  fail "--moe-backend latency did not override SERVAL_MOE_BACKEND=throughput"
stop_server "$server_pid"
echo "ok   SERVAL_MOE_BACKEND=throughput in effect; --moe-backend overrides it"

# --- An embedding model: --runner pooling, through the openai client. ---
start_server pooling "$model" --runner pooling
[[ $(curl -sf "http://127.0.0.1:$port/v1/models" | jq -r '.data[0].serval.runner') == pooling ]] ||
  fail "--runner pooling not in effect"
if command -v node >/dev/null && [[ -f $npm_modules/openai/index.mjs ]]; then
  node "$here/embeddings_openai.mjs" "http://127.0.0.1:$port/v1" "$npm_modules" ||
    fail "openai client embeddings checks failed"
else
  resp=$(curl -sf "http://127.0.0.1:$port/v1/embeddings" -d '{"input":["a b","c"]}') ||
    fail "embeddings request failed"
  [[ $(jq '.data | length' <<<"$resp") == 2 ]] || fail "embeddings: $resp"
  echo "SKIP: openai client embeddings checks (node or $npm_modules/openai missing)"
fi
# bench serve of the embeddings endpoint (vLLM's --backend openai-embeddings).
"$serval" bench serve --port "$port" --backend openai-embeddings --num-prompts 6 \
  --max-concurrency 3 --random-input-len 16 --disable-tqdm >"$work/bench-embed.out" 2>&1 || {
  cat "$work/bench-embed.out"; fail "bench serve --backend openai-embeddings exited non-zero"; }
grep -Eq '^Successful requests: +6$' "$work/bench-embed.out" &&
  grep -q 'End-to-end Latency' "$work/bench-embed.out" &&
  ! grep -q 'generated' "$work/bench-embed.out" || {
  cat "$work/bench-embed.out"; fail "bench serve --backend openai-embeddings: unexpected report"; }
# A file dataset goes as its text is (no chat template): the input tokens are the texts' own.
printf '%s\n' '{"prompt": "What is 2 + 3?"}' '{"prompt": "Name a color."}' >"$work/embed.jsonl"
want=0
for text in "What is 2 + 3?" "Name a color."; do
  n=$(curl -sf "http://127.0.0.1:$port/tokenize" -d "$(jq -nc --arg p "$text" '{prompt: $p}')" | jq .count)
  want=$((want + 2 * n))
done
"$serval" bench serve --port "$port" --backend openai-embeddings --dataset-name custom \
  --dataset-path "$work/embed.jsonl" --num-prompts 4 --disable-tqdm >"$work/bench-embed2.out" 2>&1 || {
  cat "$work/bench-embed2.out"; fail "bench serve --backend openai-embeddings (custom) failed"; }
grep -Eq "^Total input tokens: +$want\$" "$work/bench-embed2.out" || {
  cat "$work/bench-embed2.out"; fail "embeddings of a custom dataset: expected $want input tokens"; }
stop_server "$server_pid"

# --- The vLLM reference command line, as pasted (max-model-len capped by the fixture). ---
ref_len=$((max_model_len < 2058 ? max_model_len : 2058))
start_server vllm_line --model "$model" --dtype auto --kv-cache-dtype auto \
  --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 1 --swap-space 16 \
  --max-num-seqs 512 --trust-remote-code --max-model-len "$ref_len" --gpu-memory-utilization 0.9 \
  --max-num-batched-tokens 8192 --no-enable-prefix-caching --async-scheduling \
  --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}'
resp=$(curl -sf "http://127.0.0.1:$port/v1/completions" -d '{"prompt":"hi","max_tokens":5,"ignore_eos":true}') ||
  fail "vLLM command line: completion failed"
[[ $(jq -r .usage.completion_tokens <<<"$resp") == 5 ]] || fail "vLLM command line: $resp"
[[ $(curl -sf "http://127.0.0.1:$port/v1/models" | jq -r '.data[0].max_model_len') == "$ref_len" ]] ||
  fail "--max-model-len $ref_len not in effect"
grep -q "ignoring flags" "$server_log" || fail "no line about the ignored vLLM flags"
stop_server "$server_pid"
echo "ok   vLLM reference command line starts and serves"

# --- Speculative decoding (prompt lookup): `serval generate`'s greedy text, drafts on /metrics. ---
prompt_ids="5,6,7,5,6,7,5,6"
gen_ids=$(env -u SERVAL_MOE_BACKEND "$serval" generate "$model" --prompt-ids "$prompt_ids" \
  --max-tokens 24 --ignore-eos 2>"$work/generate.err" | sed -n 's/^ids: //p')
[[ -n $gen_ids ]] || { cat "$work/generate.err"; fail "serval generate failed"; }
start_server spec "$model" --speculative-config \
  '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}'
body=$(jq -nc --arg ids "$prompt_ids" \
  '{prompt: ($ids | split(",") | map(tonumber)), max_tokens: 24, temperature: 0, ignore_eos: true}')
resp=$(curl -sf "http://127.0.0.1:$port/v1/completions" -d "$body") || fail "speculative: completion failed"
want_text=$(curl -sf "http://127.0.0.1:$port/detokenize" -d "{\"tokens\":[$gen_ids]}" | jq -r .prompt)
# Bit for bit on the CPU; on a GPU the drafted steps' kernels (several rows per sequence) round
# differently from one-token decoding, which can flip a near-tie of the random-weight fixture.
spec_device=$(curl -sf "http://127.0.0.1:$port/v1/models" | jq -r '.data[0].serval.device')
if [[ $spec_device == cpu ]]; then
  [[ $(jq -r '.choices[0].text' <<<"$resp") == "$want_text" ]] ||
    fail "speculative: server text differs from serval generate's ($gen_ids): $resp"
fi
[[ $(jq -r '.usage.completion_tokens' <<<"$resp") == 24 ]] || fail "speculative: usage $resp"
metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
drafts=$(awk '/^serval:spec_decode_num_draft_tokens_total/ {print $NF}' <<<"$metrics")
[[ ${drafts:-0} -gt 0 ]] || fail "speculative: no draft tokens counted on /metrics"
grep -q "speculative decoding: prompt lookup" "$server_log" || fail "speculative: no start-up line"
stop_server "$server_pid"
echo "ok   speculative decoding gives the greedy text of plain decoding ($drafts draft tokens)"
echo "PASS"
