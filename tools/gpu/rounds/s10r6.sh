set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
ts tests
t k 150 $K --gtest_filter='Kernels.SkinnyDense*:Kernels.SkinnyUnits*:Kernels.MoeMxfp4Fragments*:Kernels.LinearRmsNorm*'
GPTOSS_TEST_SMALL=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_filter='Kernels.SkinnyDense*' --gtest_color=no > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; tail -1 $out/memcheck.log >> $S
t m 200 $bin/test_cuda_model
t spec 100 $bin/test_cuda_spec
for tk in 2 4; do
  timeout 100 $g bench-kernels --model 120b --tokens $tk --iters 100 > $out/bk_$tk.log 2>&1
  echo "== tokens $tk" >> $S
  grep -E '^\| (o_proj|lm_head).*skinny_mma (bf16|fp8) (\||ks16 rt2)' $out/bk_$tk.log | awk -F'|' '{printf "%s|%s|%s\n", $2, $4, $5}' >> $S
done
ts bench
for m in 120b 20b; do timeout 150 $g bench --device cuda --random-weights $m --pp 2048 --tg 64 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random" >> $S; done
for m in 120b 20b; do
timeout 60 $g bench --device cuda --random-weights $m --dense-dtype fp8 --pp '' --tg 64 --batch 1,8 --runs 1 2>&1 | grep -E "^\| random" >> $S
timeout 60 $g bench --device cuda --random-weights $m --mxfp4-layers all --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
ts done
cat $S
