set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
GPTOSS_SKINNY_OPT=3 timeout 100 $K --gtest_filter='Kernels.MoeMxfp4FragmentsDecode' --gtest_color=no > $out/kd.log 2>&1; echo "kd rc=$?"; grep -E "FAILED|Failure|rel err" $out/kd.log | head -5
ts bk
GPTOSS_SKINNY_OPT=3 timeout 120 $g bench-kernels --model 120b --tokens 1 --iters 50 > $out/bk1.txt 2>&1; grep -E "experts gate_up \(mxfp4\)|experts down \(mxfp4\)" $out/bk1.txt | grep -E "ks=8|rt4 pf1|rt2 pf4|ring" | head -12
for o in 3 1; do ts "tg opt $o"; GPTOSS_SKINNY_OPT=$o timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,2 --runs 2 2>&1 | grep -E "^\| random"; done
ts "20b"; GPTOSS_SKINNY_OPT=3 timeout 90 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random"
ts memcheck
GPTOSS_SKINNY_OPT=3 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4FragmentsDecode' > $out/memcheck.log 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY" $out/memcheck.log | head -2
ts done
