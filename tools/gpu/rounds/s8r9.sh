set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
GPTOSS_CUDA_PROFILE=1 timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 16 --batch 32 --runs 1 > $out/prof32.txt 2>&1; grep -A30 "cuda profile" $out/prof32.txt | head -30 >> $S
timeout 60 $g bench-kernels --model 120b --tokens 32 --attention-only --iters 30 > $out/attn32.txt 2>&1; grep -iE "fused|splits|decode" $out/attn32.txt | head -12 >> $S
cat $S
