set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?"; grep -E "^\[  FAILED|PASSED|Failure|exception" $out/$name.log | head -8; }
t k 200 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.MoeMxfp4Fragments*'
ts memcheck; GPTOSS_TEST_SMALL=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.SkinnyUnits*' > $out/memcheck.log 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -5
for M in 120b 20b; do for T in 1 2 8 32 64; do ts bk$M-$T; timeout 100 $g bench-kernels --model $M --tokens $T --iters 50 > $out/bk$M-$T.txt 2>&1; grep -E "experts (gate_up|down) \(mxfp4\).*(units|ks8 rt4 pf1|ks8 rt2 pf4|\| default \|)|plain read" $out/bk$M-$T.txt | grep -v checkpoint; done; done
ts bench
for M in 120b 20b; do
timeout 150 $g bench --device cuda --random-weights $M --pp '' --tg 64 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random"
GPTOSS_SKINNY_OPT=1 timeout 150 $g bench --device cuda --random-weights $M --pp '' --tg 64 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random" | sed 's/^/OPT=1 /'
done
t spec 120 $bin/test_cuda_spec
GPTOSS_TEST_SMALL=1 t m 100 $bin/test_cuda_model --gtest_filter=-*TinyFixture*
ts done
