set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual|gptoss:" $out/$name.log | head -8 >> $S; }
ts tests
t m 150 $bin/test_cuda_model
ts bench
timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 1,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
ts done
cat $S
