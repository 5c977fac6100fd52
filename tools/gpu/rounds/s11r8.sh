set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
srv() {  # port model flags... -- concurrency...
  local port=$1 m=$2; shift 2; local flags=(); while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $m --port $port --max-model-len 8192 --max-num-seqs 64 "${flags[@]}" > $out/serve_${m}_$port.log 2>&1 &
  local pid=$!
  for _ in $(seq 150); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  for c in "$@"; do ts "serve $m ${flags[*]} $c streams"; timeout 120 $g bench-serve --base-url http://127.0.0.1:$port --requests $((c * 2)) --concurrency $c --input-len 512 --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^TPOT|^aggregate|first error" >> $S; done
  kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve_${m}_$port.log >> $S
}
srv 18100 20b -- 32 64
srv 18101 20b --max-num-batched-tokens 4096 -- 32 64
srv 18102 20b --max-num-batched-tokens 8192 -- 32 64
srv 18103 120b -- 64
srv 18104 120b --max-num-batched-tokens 4096 -- 64
srv 18105 120b --max-num-batched-tokens 8192 -- 64
ts done
cat $S
