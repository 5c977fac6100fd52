set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual" $out/$name.log | head -12 >> $S; }
ts attn
for T in 1 32 64; do timeout 90 $g bench-kernels --model 120b --tokens $T --attention-only --iters 30 > $out/a$T.txt 2>&1; grep -E "\| attention \| [0-9]+ x " $out/a$T.txt | grep -E "plan|launches" | awk -F'|' '{printf "%s|%s|%s|%s\n",$3,$4,$5,$6}' >> $S; done
ts tests
t k 200 $K --gtest_filter='Kernels.AttentionDecodeFused'
GPTOSS_TEST_SMALL=1 t ks 100 $K --gtest_filter='Kernels.AttentionDecodeFusedMatchesTwoKernels'
GPTOSS_TEST_SMALL=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY" $out/memcheck.log | head -2 >> $S
ts done
cat $S
