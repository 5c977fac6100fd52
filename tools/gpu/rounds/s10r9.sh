set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
ts "determinism check (20b, 64 streams, 512 in / 256 out, tight KV 16384 positions)"
OUT=$out/det timeout 400 bash tools/gpu/determinism_check.sh $g > $out/det.log 2>&1; echo "determinism rc=$?" >> $S
grep -E "==|identical|failed|preemptions|aggregate|TTFT" $out/det.log >> $S
ts "batch-invariant cost"
for m in 20b 120b; do
  timeout 100 $g bench --device cuda --random-weights $m --batch-invariant --pp 2048 --tg 64 --batch 1,32 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
t m 200 $bin/test_cuda_model
ts done
cat $S
