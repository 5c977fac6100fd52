#!/usr/bin/env bash
# Deterministic serving under load (issue 14): N concurrent greedy requests with random-token
# prompts, served with --batch-invariant and a KV cache small enough to force preemption, must
# give the texts of an ample cache and of the same requests sent one at a time. Also prints
# bench-serve's figures for each run and the preemption count. Exits 1 when a text differs.
#
#   tools/gpu/determinism_check.sh [GPTOSS_BINARY]          # default build-gpu/gptoss
# Environment (defaults): DEVICE=cuda MODEL="--random-weights 20b" N=64 IN=512 OUTLEN=256
#   TIGHT_KV=16384 (positions; 64 x 768 would need 49152) SERVE_FLAGS="--batch-invariant"
#   PORT=18100 OUT=./determinism-out
# On the CPU, with the built-in tiny model (a quick check of the script itself):
#   DEVICE=cpu MODEL= N=16 IN=16 OUTLEN=48 TIGHT_KV=256 tools/gpu/determinism_check.sh build-cpu/gptoss
set -uo pipefail
gptoss=${1:-build-gpu/gptoss}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL---random-weights 20b}
N=${N:-64}
IN=${IN:-512}
OUTLEN=${OUTLEN:-256}
TIGHT_KV=${TIGHT_KV:-16384}
SERVE_FLAGS=${SERVE_FLAGS---batch-invariant}
PORT=${PORT:-18100}
out=${OUT:-./determinism-out}
mkdir -p "$out"
ctx=$((IN + OUTLEN + 16))
pid=

serve() {  # kv_tokens name
  # shellcheck disable=SC2086
  "$gptoss" serve --device "$DEVICE" $MODEL --served-model-name m --port "$PORT" --max-num-seqs "$N" \
    --max-model-len "$ctx" --kv-cache-tokens "$1" $SERVE_FLAGS >"$out/serve-$2.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf "localhost:$PORT/health" >/dev/null && return 0; sleep 1; done
  echo "server ($2) did not come up"; tail -20 "$out/serve-$2.log"; kill "$pid"; exit 2
}
unserve() {
  curl -s "localhost:$PORT/metrics" | grep -E '^gptoss:num_preemptions_total|^gptoss:step_(host|forward)_seconds_(sum|count)'
  kill -TERM "$pid"; wait "$pid"
}
bench() {  # concurrency name
  echo "== $2: $N requests, at most $1 in flight, prompts $IN, outputs $OUTLEN"
  "$gptoss" bench-serve --base-url "http://127.0.0.1:$PORT" --model m --requests "$N" --concurrency "$1" \
    --input-len "$IN" --output-len "$OUTLEN" --ignore-eos --temperature 0 --seed 1 \
    --outputs "$out/$2.jsonl" --json "$out/$2.json" | tail -9
}
same() {  # a b: lines (requests) whose text differs
  diff "$out/$1.jsonl" "$out/$2.jsonl" | grep -c '^<'
}

serve "$TIGHT_KV" tight
bench "$N" tight
unserve
serve $((N * ctx)) ample
bench "$N" ample
bench 1 alone
unserve
rc=0
for pair in "tight ample" "tight alone" "ample alone"; do
  set -- $pair
  d=$(same "$1" "$2")
  echo "$1 vs $2: $((N - d)) of $N texts identical"
  [ "$d" = 0 ] || rc=1
done
grep -q '"ok":false' "$out"/*.jsonl && { echo "some requests failed"; rc=1; }
exit $rc
