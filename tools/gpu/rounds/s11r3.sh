set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
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
t m 300 $bin/test_cuda_model
t spec 120 $bin/test_cuda_spec
ts kernels
for tk in 48 64; do
  for nt in 0 6; do
    GPTOSS_SKINNY_NT2_MIN=$nt timeout 120 $g bench-kernels --model 20b --tokens $tk --iters 50 > $out/bk_20b_${tk}_$nt.log 2>&1
    echo "== 20b $tk NT2_MIN=$nt" >> $S
    grep -E "experts (gate_up|down) \(mxfp4\) .*(fragments)|gate_up \+ down \+ combine" $out/bk_20b_${tk}_$nt.log | cut -c1-150 >> $S
  done
done
ts bench
for m in 20b 120b; do timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,16,24,32,48,64 --runs 1 2>&1 | grep -E "^\| random" >> $S; done
echo "== 20b NT2_MIN=6" >> $S
GPTOSS_SKINNY_NT2_MIN=6 timeout 150 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 32,48,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
for m in 20b 120b; do timeout 100 $g bench --device cuda --random-weights $m --dense-dtype fp8 --pp '' --tg 64 --batch 32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S; done
srv 18100 20b -- 32 64
srv 18101 120b -- 32 64
ts done
cat $S
