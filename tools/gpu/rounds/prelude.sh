# Sourced by a round script (bash, from the repository root on the GPU machine, prebuilt binaries
# unpacked into .gpu-carry/): the environment every round sets and the helpers they share.
#   ts MSG                         a timestamped line in the summary
#   t NAME SECONDS BINARY ARGS...  a gtest binary under a timeout; rc and failures in the summary
#   srv PORT MODEL FLAGS... -- C...  a `serve` on random weights, `bench-serve` at each concurrency C
#                                  (2C requests, 512 in / 256 out), the timeline line at the end
#   serve_up MODEL FLAGS...; bench_c C; serve_down
#                                  the same in steps, on port 18000 (runs in between)
#   serve_cs MODEL FLAGS... -- C...  serve_up, bench_c at each C (a summary line before each), serve_down
#   b NAME BINARY MODEL TG BATCH ARGS...  one `bench` decode run (tg TG at BATCH, --runs ${RUNS:-2}) of
#                                  BINARY under a "== NAME" line, its result rows in the summary
#   trace_bench NAME BATCH ARGS...  one traced `bench` decode run (tg16 at BATCH; ARGS: the model and
#                                  flags, e.g. --random-weights 120b --dense-dtype fp8) under the
#                                  environment set before it; build/libgptoss_kernel_trace.so carried;
#                                  the report in $out/r_NAME_BATCH.txt, its lines matching $TRACE_GREP
#                                  (and, node by node, $TRACE_NODES_GREP's lines 3-6) in the summary
#   clocks NAME GREP MODEL FLAGS...  a diagnostic binary's stage clocks ($bin/gptoss_NAME, from
#                                  tools/gpu/diag_binary.sh): tg64 at one token under the
#                                  environment set before it; its lines matching GREP, once each
#   sanitize FILTER TOOL...        compute-sanitizer TOOL (memcheck, racecheck, synccheck) over the
#                                  kernel tests FILTER names, small cases; rc and the summaries
#   pp_ab VAR "A B" PPS MODEL...  each MODEL's prefill (`bench --pp PPS`) under VAR=A, VAR=B, A, B,
#                                  each run's rows under an "== MODEL VAR=v" line
#   bk_v5 NAME MODEL TOKENS [GREP]  bench-kernels' version 5 k-permuted rows
#                                  (GPTOSS_BENCH_V5_KPERM_ONLY=1) at TOKENS under the environment
#                                  set before it, under "== NAME"; the rows matching GREP (all: v5)
#   bench_rate RATE N              on a serve_up server: N requests at RATE req/s (Poisson), 256-768
#                                  in / 128-384 out, seed 1; TTFT, TPOT, ITL and output in the summary
#   mixed NAME ARGS...             on a serve_up server: 64 requests at 32 streams, 512 in / 256 out,
#                                  bench-serve's ARGS added (e.g. --extra-body '{...}' --extra-body-every 8)
#   bk_walk NAME BINARY TOKENS LIMIT  bench-kernels (120b, TOKENS, --sm-limit LIMIT; 0: every SM) under
#                                  "== bench-kernels ..."; the walk's and plain reads' rows
#                                  (WALK_ROWS, a regex) in the summary, the whole table in $out
#   left SECONDS                   true while the round has run less than SECONDS (start a part only
#                                  if it can end within the call's limit: `left 300 && t ...`)
#   binof V                        main's binary for V = main, else the diagnostic copy $bin/gptoss_V
#   moe64 V                        V's "gate_up + down + combine" us in bk_walk's 64-token table
#   serve_each BEFORE V...         120b serving at 32 and 64 streams with each V's binary, each
#                                  started only while the round has run less than BEFORE seconds
# The summary is $OUT/summary.txt ($S); logs go beside it. Rounds of sessions 7-11 spell this out
# in each script; later ones source it.
set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
nccl_lib=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$bin/lib:$nccl_lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib"
export GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
export NCCL_NVLS_ENABLE=0  # never NVLink SHARP / multicast on the shared machines
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS
ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
left() { [ $((SECONDS-T0)) -lt $1 ]; }
t() {
  local name=$1 to=$2; shift 2
  timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S
  grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S
}
clocks() {
  local name=$1 pat=$2; shift 2
  timeout 100 $bin/gptoss_$name bench --device cuda --random-weights "$@" --pp '' --tg 64 --batch 1 --runs 1 2>&1 |
    grep -E "^\| random|$pat" | awk '!seen[$0]++' >> $S
}
sanitize() {
  local filter=$1; shift
  for tool in "$@"; do
    GPTOSS_TEST_SMALL=1 timeout 200 compute-sanitizer --tool $tool $K --gtest_filter="$filter" --gtest_color=no \
      > $out/san_$tool.log 2>&1
    echo "$tool rc=$?" >> $S
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $out/san_$tool.log | head -4 >> $S
  done
}
srv() {
  local port=$1 m=$2; shift 2; local flags=(); while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $m --port $port --max-model-len 8192 --max-num-seqs 64 \
    "${flags[@]}" > $out/serve_${m}_$port.log 2>&1 &
  local pid=$!
  for _ in $(seq 150); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  for c in "$@"; do
    ts "serve $m ${flags[*]} $c streams"
    timeout 120 $g bench-serve --base-url http://127.0.0.1:$port --requests $((c * 2)) --concurrency $c --input-len 512 \
      --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^TPOT|^aggregate|first error" >> $S
  done
  kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve_${m}_$port.log >> $S
}
serve_up() {
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $1 --port 18000 --max-model-len 8192 --max-num-seqs 64 \
    "${@:2}" > $out/serve.log 2>&1 &
  serve_pid=$!
  for _ in $(seq 200); do curl -sf localhost:18000/health >/dev/null && break; sleep 1; done
  grep -E "warm-up" $out/serve.log >> $S
}
bench_c() {
  timeout 100 $g bench-serve --base-url http://127.0.0.1:18000 --requests $(($1 * 2)) --concurrency $1 --input-len 512 \
    --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^aggregate|first error" >> $S
}
bench_rate() {
  timeout 100 $g bench-serve --base-url http://127.0.0.1:18000 --requests $2 --request-rate $1 --input-len 256:768 \
    --output-len 128:384 --ignore-eos --seed 1 2>&1 | grep -E "^TTFT|^TPOT|^ITL|^aggregate|first error" >> $S
}
mixed() {
  ts "$1"
  timeout 120 $g bench-serve --base-url http://127.0.0.1:18000 --requests 64 --concurrency 32 --input-len 512 \
    --output-len 256 --ignore-eos "${@:2}" 2>&1 | grep -E "^TTFT|^TPOT|^aggregate|first error" >> $S
}
serve_down() { kill -INT $serve_pid; wait $serve_pid; grep -E "cuda timeline" $out/serve.log >> $S; }
serve_cs() {
  local flags=(); while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
  serve_up "${flags[@]}"
  for c in "$@"; do ts $c; bench_c $c; done
  serve_down
}
b() {
  local name=$1 bin_=$2 m=$3 tg=$4 batch=$5; shift 5
  echo "== $name $m tg$tg x$batch $*" >> $S
  timeout 100 $bin_ bench --device cuda --random-weights $m --pp '' --tg $tg --batch $batch --runs ${RUNS:-2} "$@" 2>&1 |
    grep -E "^\| random|rror" >> $S
}
trace_bench() {
  local name=$1 batch=$2; shift 2
  echo "== $name x$batch" >> $S
  CUDA_INJECTION64_PATH=$bin/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=$out/t_${name}_$batch.csv \
    timeout 100 $g bench --device cuda "$@" --pp '' --tg 16 --batch $batch --runs 1 2>&1 | grep -E "^\| random|rror" >> $S
  python3 tools/gpu/kernel_trace_report.py $out/t_${name}_$batch.csv > $out/r_${name}_$batch.txt 2>&1
  grep -E "${TRACE_GREP:-replay to replay|sum of adds}" $out/r_${name}_$batch.txt | head -8 >> $S
  if [ -n "${TRACE_NODES_GREP:-}" ]; then
    python3 tools/gpu/kernel_trace_report.py --nodes $out/t_${name}_$batch.csv 2>&1 | grep -E "$TRACE_NODES_GREP" | sed -n 3,6p >> $S
  fi
  rm -f $out/t_${name}_$batch.csv  # (a call brings back few files)
}
WALK_ROWS="gate_up \+ down \+|plain read.*(stream \(memory|walk's grid, 8|2 blocks an SM)|\(mxfp4\).*(\(fragments\)|rt1 pf8 16w\b)|sm-limit"
bk_walk() {
  timeout $(( $4 > 0 ? 150 : 60 )) $2 bench-kernels --model 120b --tokens $3 --iters 20 --sm-limit $4 > $out/bk$3_$1_$4.txt 2>&1
  echo "== bench-kernels $3 tokens, $1, --sm-limit $4 (rc $?)" >> $S
  grep -E "$WALK_ROWS" $out/bk$3_$1_$4.txt | grep -v "16-token" | head -16 >> $S
}
pp_ab() {
  local var=$1 vals=$2 pps=$3; shift 3
  for m in "$@"; do for v in $vals $vals; do
    echo "== $m $var=$v" >> $S
    env "$var=$v" timeout 100 $g bench --device cuda --random-weights $m --pp $pps --tg '' --runs 1 2>&1 |
      grep -E "^\| random" >> $S
  done; done
}
bk_v5() {
  local name=$1 m=$2 tk=$3 pat=${4:-v5}
  local log=$out/bk_$(printf '%s' "$name" | tr -c 'A-Za-z0-9_' '_').txt
  echo "== $name" >> $S
  GPTOSS_BENCH_V5_KPERM_ONLY=1 timeout 90 $g bench-kernels --model $m --tokens $tk --iters 5 > "$log" 2>&1
  grep -E "gate_up \+ down.*v5.*kperm" "$log" | grep -E "$pat" |
    sed -E 's/^\| experts gate_up \+ down \| [^|]*\| //' >> $S
}
binof() { if [ $1 = main ]; then echo $g; else echo $bin/gptoss_$1; fi; }
moe64() { grep -E "gate_up \+ down \+ combine" $out/bk64_$1_0.txt 2>/dev/null | awk -F'|' '{print $5+0}' | head -1; }
serve_each() {
  local before=$1 g0=$g v; shift
  for v in "$@"; do
    g=$(binof $v)
    if left $before; then ts "serve $v"; serve_cs 120b -- 32 64; fi
  done
  g=$g0
}
