#!/usr/bin/env bash
# End-to-end: 200 concurrent streaming openai clients, then 100 clients that disconnect
# mid-stream or during prefill; after each, /metrics must show nothing running or waiting and
# every KV block free, and the server must keep serving.
# Usage: server_load_test.sh SERVAL_BINARY REPO_ROOT
set -euo pipefail
serval=$1
root=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_fixture
need_node

start_server load "$model"
base=http://127.0.0.1:$port/v1
node "$here/server_load.mjs" "$base" "$npm_modules" concurrent || fail "concurrent clients"
wait_idle
echo "ok   idle after the concurrent clients (0 running, 0 waiting, all KV blocks free)"

prompt_before=$(metric serval:prompt_tokens_total)
aborted_before=$(curl -s "http://127.0.0.1:$port/metrics" |
  grep -E '^serval:request_success_total\{.*finished_reason="abort"' | awk '{print $NF}')
node "$here/server_load.mjs" "$base" "$npm_modules" disconnect || fail "disconnecting clients"
wait_idle
aborted_after=$(curl -s "http://127.0.0.1:$port/metrics" |
  grep -E '^serval:request_success_total\{.*finished_reason="abort"' | awk '{print $NF}')
((aborted_after - aborted_before >= 50)) ||
  fail "only $((aborted_after - aborted_before)) requests counted as aborted after 100 disconnects"
prompt_after=$(metric serval:prompt_tokens_total)
# Some long prompt was being prefilled when its client left (the rest were still waiting).
((prompt_after - prompt_before > 1000)) || fail "no prefill ran during the disconnect test"
echo "ok   idle after the disconnects ($((aborted_after - aborted_before)) requests aborted)"
r=$(curl -sf "$base/completions" -d '{"prompt":"again","max_tokens":4,"ignore_eos":true}') ||
  fail "no answer after the disconnects"
[[ $(jq -r .usage.completion_tokens <<<"$r") == 4 ]] || fail "bad answer after the disconnects: $r"
stop_server "$server_pid"
echo "PASS"
