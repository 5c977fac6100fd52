set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -10 >> $S; }
t k 150 $K --gtest_filter='Kernels.Router*:Kernels.MoeRoute*'
GPTOSS_TEST_SMALL=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.Router*' > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY" $out/memcheck.log | head -2 >> $S
for T in 1 8 32 64; do timeout 60 $g bench-kernels --model 120b --tokens $T --iters 50 > $out/bk$T.txt 2>&1; grep -E "^\| router \+ route .*(auto|old).*L2" $out/bk$T.txt >> $S; done
for m in 120b 20b; do ts "bench $m"; timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random" >> $S; done
t m 200 $bin/test_cuda_model
ts done
cat $S
