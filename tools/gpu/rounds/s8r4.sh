set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -10 >> $S; }
ts tests
t k 300 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.MoeMxfp4Fragments*:Kernels.SkinnyDense*:Kernels.StreamK*:Kernels.Expert*:Kernels.Router*:Kernels.MoeCombine*:Kernels.MoeRoute*:Kernels.LinearRmsNorm'
GPTOSS_TEST_SMALL=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.MoeMxfp4FragmentsDecode:Kernels.SkinnyDense' > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY" $out/memcheck.log | head -2 >> $S
t m 240 $bin/test_cuda_model
t spec 120 $bin/test_cuda_spec
t eagle 120 $bin/test_cuda_eagle3
ts bench-kernels
timeout 120 $g bench-kernels --model 120b --tokens 1 --iters 50 > $out/bk1.txt 2>&1
for m in 120b 20b; do ts "bench $m"; timeout 150 $g bench --device cuda --random-weights $m --pp 2048 --tg 64 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random" >> $S; done
ts "fp8 / mxfp4 dense"
for m in 120b 20b; do
timeout 90 $g bench --device cuda --random-weights $m --dense-dtype fp8 --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random" >> $S
timeout 90 $g bench --device cuda --random-weights $m --mxfp4-layers all --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random" >> $S
done
ts done
cat $S
grep -E "^\| (qkv|o_proj) .*skinny_mma bf16 \|" $out/bk1.txt
