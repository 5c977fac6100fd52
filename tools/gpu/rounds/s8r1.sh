set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?"; grep -E "^\[  FAILED|PASSED|Failure|exception" $out/$name.log | head -8; }
t k 200 $K --gtest_filter='Kernels.SkinnyItems*:Kernels.MoeMxfp4Fragments*:Kernels.SkinnyDense*:Kernels.ExpertGemm*'
ts memcheck; GPTOSS_TEST_SMALL=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.SkinnyItems*:Kernels.MoeMxfp4FragmentsDecode' > $out/memcheck.log 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -5
for T in 1 2 8 32 64; do ts bk$T; timeout 100 $g bench-kernels --model 120b --tokens $T --iters 50 > $out/bk$T.txt 2>&1; grep -E "experts (gate_up|down) \(mxfp4\)|plain read" $out/bk$T.txt | grep -vE "checkpoint|v[123] |ks=4" | head -24; done
ts bench; timeout 150 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random"
GPTOSS_SKINNY_OPT=1 timeout 100 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,8,32 --runs 2 2>&1 | grep -E "^\| random" | sed 's/^/OPT=1 /'
timeout 120 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 1,32,64 --runs 2 2>&1 | grep -E "^\| random"
GPTOSS_TEST_SMALL=1 t m 100 $bin/test_cuda_model
ts done
