#!/usr/bin/env bash
# End-to-end: `serval serve` on the fixture model, then `bench serve` and `eval gsm8k` against it.
# Usage: clients_test.sh SERVAL_BINARY REPO_ROOT
set -euo pipefail
serval=$1
root=$2
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"
need_fixture
start_server clients "$model"

# Prints the value of a report line ("Label:   value").
value_of() { grep -F "$1" "$2" | head -n1 | sed -e "s/^.*:[[:space:]]*//" | tr -d '[:space:]'; }

"$serval" bench serve --port "$port" --num-prompts 20 --max-concurrency 4 \
  --random-input-len 32 --random-output-len 16 --ignore-eos --disable-tqdm \
  >"$work/bench.out" 2>"$work/bench.err" || {
  cat "$work/bench.out" "$work/bench.err"; fail "bench serve exited non-zero"; }
cat "$work/bench.out"
[[ $(value_of "Successful requests:" "$work/bench.out") == 20 ]] || fail "expected 20 successful requests"
[[ $(value_of "Failed requests:" "$work/bench.out") == 0 ]] || fail "expected 0 failed requests"
[[ $(value_of "Total generated tokens:" "$work/bench.out") == 320 ]] || fail "expected 320 generated tokens"
grep -q "^============ Serving Benchmark Result ============$" "$work/bench.out" || fail "no report title"

# File datasets, tokenized by the server: custom JSONL (through the chat template) and ShareGPT.
printf '%s\n' '{"prompt": "What is 2 + 3?"}' '{"prompt": "Name a color."}' >"$work/custom.jsonl"
"$serval" bench serve --port "$port" --dataset-name custom --dataset-path "$work/custom.jsonl" \
  --num-prompts 5 --custom-output-len 8 --ignore-eos --disable-tqdm >"$work/custom.out" 2>&1 || {
  cat "$work/custom.out"; fail "bench serve --dataset-name custom exited non-zero"; }
[[ $(value_of "Successful requests:" "$work/custom.out") == 5 ]] || { cat "$work/custom.out"; fail "custom: expected 5 successful requests"; }
[[ $(value_of "Total generated tokens:" "$work/custom.out") == 40 ]] || fail "custom: expected 40 generated tokens"
cat >"$work/sharegpt.json" <<'JSON'
[{"conversations": [{"from": "human", "value": "Tell me about the sea and its waves."},
                    {"from": "gpt", "value": "The sea is wide and its waves roll in all day long."}]}]
JSON
"$serval" bench serve --port "$port" --dataset-name sharegpt --dataset-path "$work/sharegpt.json" \
  --num-prompts 3 --sharegpt-output-len 6 --ignore-eos --disable-tqdm >"$work/sharegpt.out" 2>&1 || {
  cat "$work/sharegpt.out"; fail "bench serve --dataset-name sharegpt exited non-zero"; }
[[ $(value_of "Total generated tokens:" "$work/sharegpt.out") == 18 ]] || { cat "$work/sharegpt.out"; fail "sharegpt: expected 18 generated tokens"; }

# The chat endpoint: random prompts as text (the server's /detokenize), then the custom prompts.
"$serval" bench serve --port "$port" --backend openai-chat --num-prompts 6 --max-concurrency 3 \
  --random-input-len 16 --random-output-len 8 --ignore-eos --disable-tqdm >"$work/chat.out" 2>&1 || {
  cat "$work/chat.out"; fail "bench serve --backend openai-chat exited non-zero"; }
[[ $(value_of "Successful requests:" "$work/chat.out") == 6 ]] || { cat "$work/chat.out"; fail "chat: expected 6 successful requests"; }
[[ $(value_of "Total generated tokens:" "$work/chat.out") == 48 ]] || { cat "$work/chat.out"; fail "chat: expected 48 generated tokens"; }
(( $(value_of "Total input tokens:" "$work/chat.out") > 6 * 16 )) || { cat "$work/chat.out"; fail "chat: the prompts' template tokens are not counted"; }
"$serval" bench serve --port "$port" --backend openai-chat --endpoint /v1/chat/completions \
  --dataset-name custom --dataset-path "$work/custom.jsonl" --num-prompts 4 --custom-output-len 5 \
  --ignore-eos --disable-tqdm >"$work/chat-custom.out" 2>&1 || {
  cat "$work/chat-custom.out"; fail "bench serve --backend openai-chat (custom) exited non-zero"; }
[[ $(value_of "Total generated tokens:" "$work/chat-custom.out") == 20 ]] || { cat "$work/chat-custom.out"; fail "chat custom: expected 20 generated tokens"; }

"$serval" eval gsm8k --port "$port" --num-questions 10 --data-dir "${SERVAL_GSM8K_DIR:-$root/../shared/data/gsm8k}" \
  --disable-tqdm >"$work/eval.out" 2>"$work/eval.err" || {
  cat "$work/eval.out" "$work/eval.err"; fail "eval gsm8k exited non-zero"; }
cat "$work/eval.out"
grep -Eq '^Accuracy: [0-9]+\.[0-9]{3}$' "$work/eval.out" || fail "no Accuracy line"
grep -Eq '^Invalid responses: [0-9]+\.[0-9]{3}$' "$work/eval.out" || fail "no Invalid responses line"
grep -Eq '^Total latency: [0-9]+\.[0-9]{3} s$' "$work/eval.out" || fail "no Total latency line"
grep -Eq '^Questions per second: [0-9]+\.[0-9]{3}$' "$work/eval.out" || fail "no Questions per second line"
echo "PASS"
