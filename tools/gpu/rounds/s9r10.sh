set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
srv() {  # model concurrency...
  local m=$1; shift
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $m --port 18100 --max-model-len 8192 --max-num-seqs 64 > $out/serve_$m.log 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf localhost:18100/health >/dev/null && break; sleep 1; done
  for c in "$@"; do ts "serve $m $c streams"; timeout 100 $g bench-serve --base-url http://127.0.0.1:18100 --requests $((c * 2)) --concurrency $c --input-len 512 --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^TPOT|^aggregate|first error" >> $S; done
  kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve_$m.log >> $S
}
srv 20b 32 64
srv 120b 32 64
ts pp
for m in 120b 20b; do timeout 60 $g bench --device cuda --random-weights $m --pp 2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" >> $S; done
ts done
cat $S
