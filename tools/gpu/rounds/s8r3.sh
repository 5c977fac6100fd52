set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" | tee -a $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|Which is|rel_err|n=" $out/$name.log | head -12 >> $S; }
t k 240 $K --gtest_filter='Kernels.FusedCombine*:Kernels.SkinnyUnits*:Kernels.MoeMxfp4Fragments*:Kernels.SkinnyDense'
ts memcheck; GPTOSS_TEST_SMALL=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.FusedCombine*:Kernels.SkinnyUnits*' > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -5 >> $S
ts bench
for M in 120b 20b; do
timeout 150 $g bench --device cuda --random-weights $M --pp '' --tg 64 --batch 1,2,8 --runs 2 2>&1 | grep -E "^\| random" >> $S
GPTOSS_FUSED_COMBINE=0 timeout 150 $g bench --device cuda --random-weights $M --pp '' --tg 64 --batch 1,2,8 --runs 2 2>&1 | grep -E "^\| random" | sed 's/^/FC=0 /' >> $S
done
ts model; t m 200 $bin/test_cuda_model
t spec 120 $bin/test_cuda_spec
t eagle 120 $bin/test_cuda_eagle3
ts done
cat $S
