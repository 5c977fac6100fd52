set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
GPTOSS_L2_PREFETCH=2 GPTOSS_TEST_SMALL=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile:Kernels.SkinnyDense*' --gtest_color=no > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; tail -1 $out/memcheck.log >> $S
for a in 0 1 2 4; do
  for tk in 1 32; do
    GPTOSS_L2_PREFETCH=$a timeout 100 $g bench-kernels --model 120b --tokens $tk --iters 50 > $out/bk_${a}_$tk.log 2>&1
    echo "ahead $a tokens $tk: $(grep -E '^\| (qkv \(rows|o_proj).*skinny_mma bf16 \|' $out/bk_${a}_$tk.log | awk -F'|' '{printf "%s %s; ", $2, $5}') $(grep -E '^\| experts (gate_up|down) \(mxfp4\) \|.*skinny units ks8 rt4 pf1 \|' $out/bk_${a}_$tk.log | awk -F'|' '{printf "%s %s; ", $2, $5}')" >> $S
  done
done
for a in 0 1 2 4; do
  ts "bench 120b ahead $a"
  GPTOSS_L2_PREFETCH=$a timeout 100 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
for a in 0 2; do
  ts "bench 20b ahead $a"
  GPTOSS_L2_PREFETCH=$a timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
ts done
cat $S
