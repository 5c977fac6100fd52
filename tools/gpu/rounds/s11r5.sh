set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
ts tests
t k 200 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.MoeMxfp4Fragments*:Kernels.SkinnyDense*'
GPTOSS_TEST_SMALL=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_filter='Kernels.SkinnyUnits*' --gtest_color=no > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; tail -1 $out/memcheck.log >> $S
t m 120 $bin/test_cuda_model --gtest_filter='CudaModel.*Batched*'
ts kernels
for tk in 32 48 64; do
  timeout 120 $g bench-kernels --model 20b --tokens $tk --iters 50 > $out/bk_20b_$tk.log 2>&1
  echo "== 20b $tk" >> $S
  grep -E "experts (gate_up|down) \(mxfp4\) .*(units|fragments)|plain read|gate_up \+ down \+ combine" $out/bk_20b_$tk.log | cut -c1-150 >> $S
done
ts bench
for nt in 0 6; do
  echo "== 20b GPTOSS_UNITS_NT2_MIN=$nt" >> $S
  GPTOSS_UNITS_NT2_MIN=$nt timeout 150 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 24,32,48,64 --runs 2 2>&1 | grep -E "^\| random" >> $S
done
for m in 20b 120b; do for th in 17 9; do
  echo "== $m GPTOSS_CUBLAS_MIN_ROWS=$th" >> $S
  GPTOSS_CUBLAS_MIN_ROWS=$th timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 8,16 --runs 2 2>&1 | grep -E "^\| random" >> $S
done; done
ts done
cat $S
