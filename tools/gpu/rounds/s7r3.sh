set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?"; grep -E "^\[  FAILED|PASSED|Failure|exception" $out/$name.log | head -6; }
ts tests
t kd 100 $K --gtest_filter='Kernels.MoeMxfp4FragmentsDecode'
t k 300 $K --gtest_filter='Kernels.MoeMxfp4Fragments:Kernels.SkinnyDense*:Kernels.StreamK*:Kernels.Expert*:Kernels.Router*:Kernels.MoeCombine*:Kernels.MoeRoute*'
ts memcheck
timeout 200 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4FragmentsDecode' > $out/memcheck.log 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3
GPTOSS_TEST_SMALL=1 t m 200 $bin/test_cuda_model
t spec 120 $bin/test_cuda_spec
for t in 1 8; do ts "bench-kernels tokens $t"
timeout 120 $g bench-kernels --model 120b --tokens $t --iters 50 > $out/bk${t}.txt 2>&1; grep -E "skinny_mma|experts gate_up \(mxfp4\)|experts down \(mxfp4\)|plain read|qkv" $out/bk${t}.txt | grep -v "streamk\|ks16\|ks4 \|ks=4" | head -30
done
for o in 3 1 0; do ts "tg 120b opt $o"; GPTOSS_SKINNY_OPT=$o timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,32 --runs 2 2>&1 | grep -E "^\| random"; done
ts "tg 20b"; timeout 90 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 1,32,64 --runs 2 2>&1 | grep -E "^\| random"
ts "tg 120b x64 + fp8 dense"; timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 64 --runs 2 2>&1 | grep -E "^\| random"
timeout 90 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random"
ts done
