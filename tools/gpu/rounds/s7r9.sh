set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?"; grep -E "^\[  FAILED|PASSED|Failure|exception" $out/$name.log | head -6; }
t k 150 $K --gtest_filter='Kernels.MoeMxfp4Fragments*:Kernels.SkinnyDense*:Kernels.StreamKRepeatsBitForBit'
GPTOSS_TEST_SMALL=1 t m 100 $bin/test_cuda_model
ts bench; timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,32 --runs 2 2>&1 | grep -E "^\| random"
timeout 90 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 1,32 --runs 2 2>&1 | grep -E "^\| random"
ts done
