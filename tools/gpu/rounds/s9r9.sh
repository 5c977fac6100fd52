set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -8 >> $S; }
ts tests
t k 120 $K --gtest_filter='Kernels.AttentionPaged:Kernels.SkinnyUnits*:Kernels.MoeMxfp4FragmentsDecode:Kernels.RopeKv*'
GPTOSS_TEST_SMALL=1 t ks 120 $K --gtest_filter='Kernels.AttentionDecodeFused*'
t spec 100 $bin/test_cuda_spec
t m 120 $bin/test_cuda_model
ts bench
for m in 120b 20b; do timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S; done
ts done
cat $S
