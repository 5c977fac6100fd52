#!/usr/bin/env bash
# The engine and OpenAI server on the CUDA backend, for use through the device tool: serves random
# gpt-oss-20b weights, checks a chat and a text completion, then drives the server with
# bench-serve (logprobs requested: host sampling; --no-token-timing: ids picked on the device),
# then bench-serve --depth (llama-benchy's pp/tg table).
#
#   tools/gpu/serve_check.sh                    # uses build-gpu/gptoss (tools/gpu/check.sh builds it)
#   tools/gpu/serve_check.sh --prebuilt DIR     # DIR holds gptoss, lib/ and o200k_base.tiktoken
# Logs go to $OUT (the device tool's output folder) or ./gpu-check-out.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
gptoss=$root/build-gpu/gptoss
if [ "${1:-}" = "--prebuilt" ]; then
  bin=$(cd "$2" && pwd)
  gptoss=$bin/gptoss
  export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
  [ -f "$bin/o200k_base.tiktoken" ] && export GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
fi
out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
port=18000
"$gptoss" serve --device cuda --random-weights 20b --port $port --max-model-len 4096 --max-num-seqs 32 \
  >"$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
curl -sf localhost:$port/health >/dev/null || { echo "server did not come up"; tail -20 "$out/serve.log"; kill $pid; exit 1; }
curl -s localhost:$port/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"gpt-oss-20b","messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"temperature":0}' |
  head -c 400
echo
B="$gptoss bench-serve --base-url http://127.0.0.1:$port --model gpt-oss-20b --max-tokens 128"
for args in "--requests 4 --concurrency 1" "--requests 64 --concurrency 32" \
            "--requests 4 --concurrency 1 --ignore-eos --no-token-timing" \
            "--requests 64 --concurrency 32 --ignore-eos --no-token-timing" \
            "--requests 64 --concurrency 32 --ignore-eos --no-token-timing --temperature 0.8"; do
  echo "== bench-serve $args"
  timeout 120 $B $args 2>&1 | tail -6
done
echo "== bench-serve --depth 0,1024 (llama-benchy's pp/tg at depth)"
timeout 300 "$gptoss" bench-serve --base-url http://127.0.0.1:$port --model gpt-oss-20b --depth 0,1024 --pp 2048 \
  --tg 32 --runs 3 --latency-mode generation 2>&1 | tail -8
kill -TERM $pid
wait $pid
echo "serve exit: $?"
