set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
F='Kernels.SkinnyDense:Kernels.MoeMxfp4FragmentsDecode:Kernels.SkinnyUnitsKernelMatchesBlockPerTile'
t k7 150 $K --gtest_filter="$F"
GPTOSS_SKINNY_OPT=3 t k3 150 $K --gtest_filter="$F"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_filter='Kernels.MoeMxfp4FragmentsDecode' --gtest_color=no > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; tail -1 $out/memcheck.log >> $S
for b in 3 7; do for tk in 1 8; do
  GPTOSS_SKINNY_OPT=$b timeout 100 $g bench-kernels --model 120b --tp 2 --tokens $tk --iters 100 > $out/bk_${b}_$tk.log 2>&1
  echo "== opt $b tokens $tk: $(head -1 $out/bk_${b}_$tk.log)" >> $S
  grep -E '^\| (o_proj|qkv \(rows).*skinny_mma (bf16|fp8) \||^\| experts (gate_up|down) \(mxfp4\) \|.*\| skinny_mma \(fragments\)|^\| experts (gate_up|down) \(mxfp4\) \|.*(default|units ks8 rt4 pf1|units ks8 rt2 pf2) \|' $out/bk_${b}_$tk.log | awk -F'|' '{printf "%s|%s|%s|%s\n", $2, $3, $4, $5}' >> $S
done; done
ts done
cat $S
