#!/usr/bin/env bash
# End-to-end: every error of `serval serve` with curl — status code and the OpenAI error body
# {"error":{"message","type","param","code"}} — and the server keeps serving after each one.
# Also: 401 with --api-key, 503 when the waiting queue is full, bad command lines.
# Usage: server_errors_test.sh SERVAL_BINARY REPO_ROOT
set -euo pipefail
serval=$1
root=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_fixture

checks=0

# expect_error STATUS TYPE PARAM MESSAGE_ERE PATH BODY [curl args...]
# PARAM "null" means a JSON null; BODY "-" sends a GET.
expect_error() {
  local status=$1 type=$2 param=$3 msg_re=$4 path=$5 body=$6
  shift 6
  local out=$work/err.json code
  if [[ $body == - ]]; then
    code=$(curl -s -o "$out" -w '%{http_code}' "$@" "http://127.0.0.1:$port$path")
  else
    code=$(curl -s -o "$out" -w '%{http_code}' -H 'Content-Type: application/json' \
      --data-binary "$body" "$@" "http://127.0.0.1:$port$path")
  fi
  [[ $code == "$status" ]] || fail "$path $body: HTTP $code, want $status: $(cat "$out")"
  jq -e --argjson status "$status" --arg type "$type" --arg param "$param" --arg re "$msg_re" '
      (.error | keys | sort) == ["code", "message", "param", "type"]
      and .error.code == $status and .error.type == $type
      and (if $param == "null" then .error.param == null else .error.param == $param end)
      and (.error.message | type == "string" and test($re))' "$out" >/dev/null ||
    fail "$path $body: unexpected error body $(cat "$out") (want type $type, param $param, message /$msg_re/)"
  checks=$((checks + 1))
  # The server still serves.
  still_serving
}

# A normal request succeeds (with the headers in `auth`).
auth=()
still_serving() {
  local r
  r=$(curl -sf "${auth[@]}" "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":[1,2,3],"max_tokens":2,"ignore_eos":true}') || fail "server stopped serving"
  [[ $(jq -r .usage.completion_tokens <<<"$r") == 2 ]] || fail "server answers wrongly: $r"
}

start_server main "$model" --max-model-len 256
C=/v1/completions
H=/v1/chat/completions
msgs='"messages":[{"role":"user","content":"hi"}]'

# Malformed JSON and wrong shapes.
expect_error 400 BadRequestError null 'not valid JSON' $C '{"prompt": "hi", '
expect_error 400 BadRequestError null 'not valid JSON' $H '{'
expect_error 400 BadRequestError null 'JSON object' $C '[1,2,3]'
expect_error 400 BadRequestError null 'nested deeper' $C "$(printf '%.0s[' {1..200})"
# Wrong types.
expect_error 400 BadRequestError max_tokens 'integer' $C '{"prompt":"hi","max_tokens":"5"}'
expect_error 400 BadRequestError max_tokens 'integer' $C '{"prompt":"hi","max_tokens":2.5}'
expect_error 400 BadRequestError temperature 'number' $C '{"prompt":"hi","temperature":"hot"}'
expect_error 400 BadRequestError stream 'boolean' $C '{"prompt":"hi","stream":"yes"}'
expect_error 400 BadRequestError prompt 'prompt' $C '{"prompt":{"text":"hi"}}'
expect_error 400 BadRequestError prompt 'required' $C '{"max_tokens":3}'
expect_error 400 BadRequestError prompt 'vocabulary' $C '{"prompt":[1,2,99999]}'
expect_error 400 BadRequestError model 'string' $C '{"model":5,"prompt":"hi"}'
expect_error 400 BadRequestError messages 'messages' $H '{"messages":"hi"}'
expect_error 400 BadRequestError messages 'role' $H '{"messages":[{"role":"wizard","content":"x"}]}'
expect_error 400 BadRequestError stop 'string' $C '{"prompt":"hi","stop":[1,2]}'
# Out-of-range values.
expect_error 400 BadRequestError max_tokens 'at least 1, got -5' $C '{"prompt":"hi","max_tokens":-5}'
expect_error 400 BadRequestError max_tokens 'at least 1, got 0' $C '{"prompt":"hi","max_tokens":0}'
expect_error 400 BadRequestError max_completion_tokens 'at least 1' $H "{$msgs,\"max_completion_tokens\":-1}"
expect_error 400 BadRequestError temperature '>= 0' $C '{"prompt":"hi","temperature":-0.5}'
expect_error 400 BadRequestError temperature '>= 0' $H "{$msgs,\"temperature\":-1}"
expect_error 400 BadRequestError top_p '\(0, 1\]' $C '{"prompt":"hi","top_p":0}'
expect_error 400 BadRequestError top_p '\(0, 1\]' $C '{"prompt":"hi","top_p":1.5}'
expect_error 400 BadRequestError n 'at least 1' $C '{"prompt":"hi","n":0}'
expect_error 400 BadRequestError n 'at least 1' $H "{$msgs,\"n\":-2}"
expect_error 400 BadRequestError stop 'at most 4' $C '{"prompt":"hi","stop":["a","b","c","d","e"]}'
expect_error 400 BadRequestError logprobs 'logprobs' $C '{"prompt":"hi","logprobs":100}'
expect_error 400 BadRequestError top_logprobs 'logprobs' $H "{$msgs,\"top_logprobs\":2}"
expect_error 400 BadRequestError stream_options 'stream' $C '{"prompt":"hi","stream_options":{"include_usage":true}}'
# prompt + max_tokens beyond --max-model-len 256: the message names both numbers.
ids=$(seq -s, 1 200)
expect_error 400 BadRequestError max_tokens '256.*200 in the prompt, 100 for the completion' \
  $C "{\"prompt\":[$ids],\"max_tokens\":100}"
expect_error 400 BadRequestError max_completion_tokens '256.*300' $H "{$msgs,\"max_completion_tokens\":300}"
expect_error 400 BadRequestError max_tokens '256 tokens.*99999999999999 for the completion' \
  $C '{"prompt":"hi","max_tokens":99999999999999}'
expect_error 400 BadRequestError min_tokens 'min_tokens \(9\) must be <= max_completion_tokens \(8\)' \
  $H "{$msgs,\"min_tokens\":9,\"max_completion_tokens\":8}"
expect_error 400 BadRequestError prompt '256.*300' $C "{\"prompt\":[$(seq -s, 1 300)],\"max_tokens\":1}"
# 404: unknown model and unknown path; 405 wrong method.
expect_error 404 NotFoundError model 'does not exist' $C '{"model":"gpt-9","prompt":"hi"}'
expect_error 404 NotFoundError model 'does not exist' $H "{\"model\":\"gpt-9\",$msgs}"
expect_error 404 NotFoundError null 'not found' /v1/nothing '{}'
expect_error 404 NotFoundError null 'not found' /v2/models -
expect_error 405 MethodNotAllowed null 'POST' $C -
# The same errors inside a streamed request come back as plain HTTP errors, not as a stream.
expect_error 400 BadRequestError temperature '>= 0' $C '{"prompt":"hi","temperature":-1,"stream":true}'
# HEAD is GET without a body.
head=$(curl -s -I "http://127.0.0.1:$port/v1/models")
[[ $head == "HTTP/1.1 200"* ]] || fail "HEAD /v1/models: $head"
echo "ok   $checks error responses (400/404/405) with OpenAI error bodies; server kept serving"
wait_idle
stop_server "$server_pid"

# --- 401 with --api-key. ---
start_server auth "$model" --api-key sekrit
checks=0
auth=(-H 'Authorization: Bearer sekrit')
expect_error 401 AuthenticationError null 'API key' /v1/models -
expect_error 401 AuthenticationError null 'API key' $C '{"prompt":"hi"}' -H 'Authorization: Bearer wrong'
expect_error 401 AuthenticationError null 'API key' $H "{$msgs}" -H 'Authorization: Bearer wrong'
expect_error 401 AuthenticationError null 'API key' $C '{"prompt":"hi"}' -H 'Authorization: sekrit'
# /health and /metrics stay open; the key opens /v1.
[[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health") == 200 ]] || fail "/health needs a key"
auth=(-H 'Authorization: Bearer sekrit')
still_serving
auth=()
echo "ok   401 without or with a wrong API key ($checks cases); the right key works"
stop_server "$server_pid"

# --- 503 when the waiting queue is full. ---
start_server queue "$model" --max-num-seqs 1 --max-waiting-requests 2
curl_pids=()
for i in $(seq 1 24); do
  curl -s -o "$work/q$i.json" -w '%{http_code}\n' "http://127.0.0.1:$port/v1/completions" \
    -H 'Content-Type: application/json' \
    -d '{"prompt":[1,2,3],"max_tokens":200,"temperature":0,"ignore_eos":true}' >"$work/q$i.code" &
  curl_pids+=($!)
done
wait "${curl_pids[@]}"
n503=0
n200=0
for i in $(seq 1 24); do
  code=$(cat "$work/q$i.code")
  case $code in
    200)
      n200=$((n200 + 1))
      [[ $(jq -r .usage.completion_tokens "$work/q$i.json") == 200 ]] || fail "queue: bad 200 body"
      ;;
    503)
      n503=$((n503 + 1))
      jq -e '.error.code == 503 and .error.type == "ServiceUnavailableError" and .error.param == null
             and (.error.message | test("overloaded|queue"))' "$work/q$i.json" >/dev/null ||
        fail "queue: bad 503 body $(cat "$work/q$i.json")"
      ;;
    *) fail "queue: HTTP $code $(cat "$work/q$i.json")" ;;
  esac
done
((n503 > 0)) || fail "queue: no 503 out of 24 concurrent requests with --max-waiting-requests 2"
((n200 > 0)) || fail "queue: no request succeeded"
wait_idle
checks=0
still_serving
echo "ok   503 when the waiting queue is full ($n503 × 503, $n200 × 200 of 24); server kept serving"
stop_server "$server_pid"

# --- Bad command lines. ---
rc=0
env -u SERVAL_MOE_BACKEND "$serval" serve "$model" --port "$(free_port)" --moe-backend bogus >"$work/bogus.out" 2>&1 || rc=$?
[[ $rc != 0 ]] || fail "--moe-backend bogus exited 0"
grep -q "bogus" "$work/bogus.out" && grep -q "latency" "$work/bogus.out" && grep -q "throughput" "$work/bogus.out" ||
  fail "--moe-backend bogus: message lacks the choices: $(cat "$work/bogus.out")"
rc=0
SERVAL_MOE_BACKEND=bogus "$serval" serve "$model" --port "$(free_port)" >"$work/bogus_env.out" 2>&1 || rc=$?
[[ $rc != 0 ]] && grep -q "SERVAL_MOE_BACKEND" "$work/bogus_env.out" && grep -q "latency, throughput" "$work/bogus_env.out" ||
  fail "SERVAL_MOE_BACKEND=bogus: rc $rc, $(cat "$work/bogus_env.out")"
rc=0
"$serval" serve "$model" --port "$(free_port)" --max-num-seq 8 >"$work/typo.out" 2>&1 || rc=$?
[[ $rc != 0 ]] || fail "--max-num-seq exited 0"
grep -q -- "--max-num-seq'" "$work/typo.out" && grep -q -- "did you mean '--max-num-seqs'" "$work/typo.out" ||
  fail "--max-num-seq: no suggestion: $(cat "$work/typo.out")"
echo "ok   bad command lines: --moe-backend bogus (rc $rc), SERVAL_MOE_BACKEND=bogus, --max-num-seq typo"
echo "PASS"
