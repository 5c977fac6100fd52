set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
nccl_lib=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$bin/lib:$nccl_lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
export NCCL_NVLS_ENABLE=0
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
srv() {  # port model flags... -- concurrency...
  local port=$1 m=$2; shift 2; local flags=(); while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $m --port $port --max-model-len 8192 --max-num-seqs 64 "${flags[@]}" > $out/serve_${m}_$port.log 2>&1 &
  local pid=$!
  for _ in $(seq 150); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  for c in "$@"; do ts "serve $m ${flags[*]} $c streams"; timeout 120 $g bench-serve --base-url http://127.0.0.1:$port --requests $((c * 2)) --concurrency $c --input-len 512 --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^TPOT|^aggregate|first error" >> $S; done
  kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve_${m}_$port.log >> $S
}
ts tests
t eagle 100 $bin/test_cuda_eagle3
CUDA_VISIBLE_DEVICES=0 srv 18100 20b -- 32 64
CUDA_VISIBLE_DEVICES=0 srv 18101 120b -- 32 64
srv 18102 120b --tp 2 -- 1 32
ts done
cat $S
