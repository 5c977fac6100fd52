set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $S
ts tests
t k 150 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.SkinnyDense*:Kernels.MoeMxfp4Fragments*'
GPTOSS_TEST_SMALL=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile:Kernels.SkinnyDense*' --gtest_color=no > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; tail -2 $out/memcheck.log >> $S
for mode in 0 2; do
  ts "bench-kernels 120b mode $mode"
  GPTOSS_L2_PREFETCH=$mode timeout 120 $g bench-kernels --model 120b --tokens 1,32 --iters 50 > $out/bk_$mode.log 2>&1
  grep -E "default|units|router|combine|floor" $out/bk_$mode.log | grep -v -E "streamk|variant|ks[0-9]" | head -40 >> $S
done
for mode in 0 1 2 3; do
  ts "bench 120b mode $mode"
  GPTOSS_L2_PREFETCH=$mode timeout 110 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
for mode in 0 2 3; do
  ts "bench 20b mode $mode"
  GPTOSS_L2_PREFETCH=$mode timeout 90 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
ts done
cat $S
