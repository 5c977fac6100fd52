set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?" >> $S; grep -E "^\[  FAILED|PASSED|Failure|exception|Expected|actual|rel err 0\.[0-9][0-9]" $out/$name.log | head -12 >> $S; }
ts tests
t k 300 $K --gtest_filter='Kernels.AttentionDecode*:DecodeAttentionPlan.*:Kernels.AttentionPaged:Kernels.Flash*'
GPTOSS_TEST_SMALL=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY" $out/memcheck.log | head -2 >> $S
GPTOSS_TEST_SMALL=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool racecheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/racecheck.log 2>&1; echo "racecheck rc=$?" >> $S; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $out/racecheck.log | head -2 >> $S
ts attn
for T in 1 8 32 64; do timeout 90 $g bench-kernels --model 120b --tokens $T --attention-only --iters 30 > $out/attn$T.txt 2>&1; grep -E "\| attention \|" $out/attn$T.txt | grep -E "plan|3 launches|mma" | grep -vE "fused mma, (16|4) " >> $S; done
t m 240 $bin/test_cuda_model
for m in 120b 20b; do ts "bench $m"; for mma in 1 0; do GPTOSS_DECODE_ATTENTION_MMA=$mma timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,32,64 --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/mma=$mma /" >> $S; done; done
ts done
cat $S
