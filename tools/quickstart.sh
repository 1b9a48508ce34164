#!/usr/bin/env bash
# Quickstart: installs the Debian packages that are missing, builds serval (Release, Ninja, ./build)
# and serves the demo model (models/demo) on http://127.0.0.1:${PORT:-8000}, on the GPU when one
# is present (CUDA backend built when nvcc is found), otherwise on the CPU. Ctrl-C stops it.
#
# usage: tools/quickstart.sh [--no-serve] [--print-example]
#   --no-serve        install and build only
#   --print-example   print the curl example for ${PORT:-8000} and exit (used by the e2e test)
# env: PORT (8000), SERVAL_BUILD_DIR (build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
port=${PORT:-8000}
build=${SERVAL_BUILD_DIR:-build}
model=models/demo

print_example() {
  cat <<EOF
curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d '{
  "prompt": "Question: A baker makes 24 muffins and sells 15 of them. How many muffins are left?\nAnswer:",
  "max_tokens": 128, "temperature": 0, "stop": ["Question"]}'
EOF
}

serve=1
for arg in "$@"; do
  case $arg in
    --no-serve) serve=0 ;;
    --print-example) print_example; exit 0 ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

if [[ $serve == 1 && ! -f $model/model.safetensors ]]; then
  echo "error: no demo model at $root/$model (it ships with the repository)." >&2
  echo "       Rebuild it on a GPU machine with tools/train_demo_model.py (see README.md)," >&2
  echo "       or run $0 --no-serve to build only." >&2
  exit 1
fi

echo "== installing missing packages (tools/install-deps.sh)"
bash tools/install-deps.sh
echo "== building serval in $build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" serval
[[ $serve == 1 ]] || { echo "built $build/apps/serval"; exit 0; }

echo "== serving $model on http://127.0.0.1:$port"
"$build/apps/serval" serve "$model" --host 127.0.0.1 --port "$port" &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "error: serval serve exited; if port $port is taken, try PORT=8001 $0" >&2
    exit 1
  fi
  sleep 0.5
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "error: server not ready after 300 s" >&2; exit 1; }

cat <<EOF

serval is serving $model at http://127.0.0.1:$port (OpenAI API: http://127.0.0.1:$port/v1).
Try, in another terminal:

$(print_example)

Ctrl-C stops the server.
EOF
wait "$server_pid"
