#!/usr/bin/env bash
# Issue 14 on the GPU machine: `gptoss serve` under `gptoss bench-serve` at 1/32/64 streams
# (512-token random prompts, 256 output tokens, --ignore-eos), with the GPU's idle time between
# forward passes (GPTOSS_CUDA_TIMELINE=1, printed when the server stops), with the default async
# scheduling and with --no-async-scheduling; then the prefix-cache turn with the cache off, for the cached/uncached ratio.
#
#   tools/gpu/serve_round.sh BIN_DIR MODEL [extra serve flags]   # MODEL: 20b | 120b (random weights)
# BIN_DIR holds gptoss and lib/ (as tools/gpu/check.sh --prebuilt). Logs and JSON go to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$1" && pwd); m=$2; shift 2
out=${OUT:-./serve-round-out}; mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
g=$bin/gptoss
port=18100
run() {  # NAME SERVE-FLAGS... -- CONCURRENCIES...
  local name=$1; shift; local sflags=(); while [ "$1" != "--" ]; do sflags+=("$1"); shift; done; shift
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights "$m" --port $port --max-model-len 8192 \
    --max-num-seqs 64 "${sflags[@]}" > "$out/serve_${m}_$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 240); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  for c in "$@"; do
    echo "== $m $name, $c streams"
    timeout 300 $g bench-serve --base-url http://127.0.0.1:$port --requests $((c > 1 ? c * 2 : 4)) --concurrency "$c" \
      --input-len 512 --output-len 256 --ignore-eos --json "$out/bs_${m}_${name}_c$c.json" 2>&1 |
      grep -E "^requests:|^TTFT|^TPOT|^aggregate|first error"
  done
  if [ "$name" = nocache ] || [ "$name" = default ]; then
    echo "== $m $name: prefix-cache turn (~4k-token shared prefix)"
    bash "$here/../../scripts/bench/prefix_cache.sh" $port 3 2>&1 | grep -E "turn"
  fi
  kill -INT $pid; wait $pid
  grep -E "cuda timeline" "$out/serve_${m}_$name.log"
}
run default "$@" -- 1 32 64
run sync --no-async-scheduling "$@" -- 32
run nocache --no-enable-prefix-caching "$@" --
