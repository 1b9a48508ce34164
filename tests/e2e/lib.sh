# Shared helpers of the `serval serve` end-to-end scripts. Source it after setting
# `serval` (the binary) and `root` (the repo root). Every server started with start_server is
# killed on exit; on failure the logs of all of them are printed.
# shellcheck shell=bash

# Servers start with the defaults in effect; a script sets the variable per server
# (`SERVAL_MOE_BACKEND=x start_server ...`) where it tests it.
unset SERVAL_MOE_BACKEND
model=$root/tests/fixtures/qwen3_moe
npm_modules=$root/tests/npm/node_modules
work=$(mktemp -d)
declare -a server_pids=()
declare -a server_logs=()
test_failed=0

fail() {
  echo "FAIL: $*" >&2
  test_failed=1
  exit 1
}

skip() {
  echo "SKIP: $*"
  exit 0
}

e2e_cleanup() {
  local rc=$?
  for pid in "${server_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${server_pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [[ $rc != 0 || $test_failed != 0 ]]; then
    for log in "${server_logs[@]}"; do
      echo "----- server log $log -----" >&2
      tail -n 200 "$log" >&2 || true
    done
  fi
  rm -rf "$work"
}
trap e2e_cleanup EXIT

need_fixture() {
  [[ -d $model ]] || skip "no fixture model ($model)"
}

# SKIPs the script when node or the openai package is missing.
need_node() {
  command -v node >/dev/null || skip "node is not installed"
  [[ -f $npm_modules/openai/index.mjs ]] || skip "no openai package in $npm_modules (npm ci in tests/npm)"
}

# Number of visible CUDA GPUs (0 without nvidia-smi).
gpu_count() {
  command -v nvidia-smi >/dev/null || { echo 0; return; }
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -c . || true
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_server NAME [serve args...]: starts `serval serve` on a free port in the background with
# the log in $work/NAME.log; sets port, server_pid and server_log. Waits (60 s at most) for
# /health 200, failing early if the process exits. Environment: as the caller's.
start_server() {
  local name=$1
  shift
  port=$(free_port)
  server_log=$work/$name.log
  "$serval" serve "$@" --host 127.0.0.1 --port "$port" >"$server_log" 2>&1 &
  server_pid=$!
  server_pids+=("$server_pid")
  server_logs+=("$server_log")
  wait_healthy "$port" "$server_pid" "$server_log"
}

wait_healthy() {
  local p=$1 pid=$2 log=$3
  for _ in $(seq 1 600); do
    if [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p/health") == 200 ]]; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      fail "server ($log) exited before becoming healthy"
    fi
    sleep 0.1
  done
  fail "server ($log) not healthy after 60 s"
}

# stop_server PID: SIGTERM, then expects exit status 0 within 10 s.
stop_server() {
  local pid=$1
  kill -TERM "$pid"
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    fail "server $pid still running 10 s after SIGTERM"
  fi
  local rc=0
  wait "$pid" || rc=$?
  [[ $rc == 0 ]] || fail "server $pid exited with status $rc after SIGTERM (want 0)"
}

# metric NAME [PORT]: the value of the first sample of NAME on /metrics (empty if absent).
metric() {
  local page
  page=$(curl -s "http://127.0.0.1:${2:-$port}/metrics") || true
  awk -v name="$1" 'index($0, name "{") == 1 || index($0, name " ") == 1 { print $NF; exit }' <<<"$page"
}

# Polls /metrics (up to 10 s) until nothing runs or waits and every KV block is free.
wait_idle() {
  local p=${1:-$port} r w f t
  for _ in $(seq 1 100); do
    r=$(metric serval:num_requests_running "$p")
    w=$(metric serval:num_requests_waiting "$p")
    f=$(metric serval:kv_cache_free_blocks "$p")
    t=$(metric serval:kv_cache_total_blocks "$p")
    if [[ $r == 0 && $w == 0 && -n $f && $f == "$t" ]]; then return 0; fi
    sleep 0.1
  done
  fail "server not idle: running=$r waiting=$w free_blocks=$f total_blocks=$t"
}
