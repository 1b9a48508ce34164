#!/usr/bin/env bash
# End-to-end on the committed demo model (models/demo): the README's commands, for real.
#   - the curl examples of README.md and of `tools/quickstart.sh --print-example` answer in the
#     GSM8K style ("#### <number>"), completions and chat;
#   - `serval generate` and `serval tokenize` as the README shows them;
#   - `serval bench serve` (small) and `serval eval gsm8k --num-questions 20`: the model must give
#     a number in at least 80% of its answers (Invalid responses < 0.2).
# Usage: demo_model_test.sh SERVAL_BINARY REPO_ROOT
set -euo pipefail
serval=$1
root=$2
model=$root/models/demo
data=$root/../shared/data/gsm8k
if [[ ! -f $model/model.safetensors ]]; then
  echo "SKIP: no demo model ($model)"
  exit 0
fi

# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"
model=$root/models/demo  # lib.sh defaults to the fixture

# The answer style the demo model was trained on: reasoning lines, then "#### <number>".
# Reads a completion or chat response on stdin; prints its text; fails without "#### N".
check_gsm8k_answer() {
  python3 -c '
import json, re, sys
body = json.load(sys.stdin)
choice = body["choices"][0]
text = choice["text"] if "text" in choice else choice["message"]["content"]
print(repr(text))
if not re.search(r"#### -?[0-9][0-9,]*", text):
    sys.exit("no \"#### <number>\" in the answer")
if choice["finish_reason"] != "stop":
    sys.exit("finish_reason is %r, expected \"stop\" (stop string or end of turn)" % choice["finish_reason"])
'
}

start_server demo "$model"

# 1. A GSM8K test question in the eval's exact 5-shot format (SPEC §6), greedy, stop "Question".
if [[ -f $data/train.jsonl ]]; then
  python3 - "$data" >"$work/fewshot.json" <<'EOF'
import json, sys
data = sys.argv[1]
train = [json.loads(l) for l in open(f"{data}/train.jsonl")][:5]
test = json.loads(open(f"{data}/test.jsonl").readline())
prompt = "".join(f"Question: {x['question']}\nAnswer: {x['answer']}\n\n" for x in train)
prompt += f"Question: {test['question']}\nAnswer:"
print(json.dumps({"prompt": prompt, "max_tokens": 200, "temperature": 0, "stop": ["Question"]}))
EOF
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d @"$work/fewshot.json" >"$work/fewshot.out" || fail "5-shot completion request failed"
  echo "5-shot answer:"
  check_gsm8k_answer <"$work/fewshot.out" || fail "5-shot answer is not in the GSM8K style"
else
  echo "note: no GSM8K data at $data; skipping the 5-shot request and the eval"
fi

# 2. The curl examples in README.md (sh blocks that start with curl), with the test's port.
python3 - "$root/README.md" "$work" <<'EOF'
import re, sys
readme, work = sys.argv[1], sys.argv[2]
blocks = re.findall(r"```sh\n(.*?)```", open(readme).read(), re.S)
curls = [b for b in blocks if b.lstrip().startswith("curl ")]
if len(curls) < 2:
    sys.exit(f"README.md: expected a completions and a chat curl example, found {len(curls)}")
for i, b in enumerate(curls):
    open(f"{work}/readme_curl_{i}.sh", "w").write(b)
EOF
for script in "$work"/readme_curl_*.sh; do
  sed -i "s/127\.0\.0\.1:8000/127.0.0.1:$port/g" "$script"
  grep -q "127.0.0.1:$port" "$script" || fail "README curl example does not use 127.0.0.1:8000: $(cat "$script")"
  echo "README example $(basename "$script"):"
  bash "$script" >"$work/readme.out" || fail "README curl example failed: $(cat "$script")"
  check_gsm8k_answer <"$work/readme.out" || fail "README curl example: answer not in the GSM8K style"
done

# 3. The example that tools/quickstart.sh prints once its server is up.
PORT=$port bash "$root/tools/quickstart.sh" --print-example >"$work/quickstart_example.sh"
grep -q "^curl " "$work/quickstart_example.sh" || fail "quickstart --print-example printed no curl command"
echo "quickstart example:"
bash "$work/quickstart_example.sh" >"$work/quickstart.out" || fail "quickstart curl example failed"
check_gsm8k_answer <"$work/quickstart.out" || fail "quickstart example: answer not in the GSM8K style"

# 4. serval generate and serval tokenize, as in the README.
"$serval" generate "$model" --prompt $'Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:' \
  --max-tokens 96 >"$work/generate.out" 2>"$work/generate.err" || {
  cat "$work/generate.err"; fail "serval generate exited non-zero"; }
cat "$work/generate.out"
grep -Eq '#### [0-9]+' "$work/generate.out" || fail "serval generate: no '#### <number>' in the output"
"$serval" tokenize --model "$model" "Question: 12 apples" >"$work/tokenize.out" || fail "serval tokenize failed"
cat "$work/tokenize.out"
# One digit per token: "12" is two tokens; the ids round-trip through /detokenize.
python3 - "$work/tokenize.out" "$port" <<'EOF' || fail "serval tokenize output is wrong"
import json, sys, urllib.request
ids = json.load(open(sys.argv[1]))
assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), ids
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[2]}/detokenize", method="POST",
                             data=json.dumps({"tokens": ids}).encode(),
                             headers={"Content-Type": "application/json"})
text = json.load(urllib.request.urlopen(req))["prompt"]
assert text == "Question: 12 apples", repr(text)
EOF

# 5. bench serve (small) and eval gsm8k, as in the README.
"$serval" bench serve --port "$port" --num-prompts 8 --max-concurrency 4 --random-input-len 64 \
  --random-output-len 16 --ignore-eos --disable-tqdm >"$work/bench.out" 2>"$work/bench.err" || {
  cat "$work/bench.out" "$work/bench.err"; fail "bench serve exited non-zero"; }
grep -Eq '^Successful requests: +8$' "$work/bench.out" || { cat "$work/bench.out"; fail "bench: expected 8 successes"; }

if [[ -f $data/train.jsonl ]]; then
  "$serval" eval gsm8k --port "$port" --num-questions 20 --data-dir "$data" --disable-tqdm \
    >"$work/eval.out" 2>"$work/eval.err" || { cat "$work/eval.out" "$work/eval.err"; fail "eval gsm8k exited non-zero"; }
  cat "$work/eval.out"
  invalid=$(sed -n 's/^Invalid responses: \([0-9.]*\)$/\1/p' "$work/eval.out")
  [[ -n $invalid ]] || fail "no 'Invalid responses' line"
  python3 -c "import sys; sys.exit(0 if float('$invalid') < 0.2 else 1)" ||
    fail "Invalid responses $invalid: the demo model should give a number in >= 80% of answers"
fi
echo "PASS"
