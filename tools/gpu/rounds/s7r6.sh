set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
ts bk; timeout 120 $g bench-kernels --model 120b --tokens 1 --iters 50 > $out/bk1.txt 2>&1; grep -E "^\| qkv|^\| o_proj \| 1x2880x4096 \| skinny_mma (bf16|fp8) \||router \+ route.*auto|combine.*default|gate_up \(mxfp4\).*ks=8|down \(mxfp4\).*ks=8|lm_head.*skinny_mma (bf16|fp8) \|" $out/bk1.txt
ts attn; timeout 120 $g bench-kernels --model 120b --tokens 1 --attention-only --iters 50 > $out/attn.txt 2>&1; grep -iE "decode|fused" $out/attn.txt | head -12
ts profile; GPTOSS_CUDA_PROFILE=1 timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 16 --runs 1 > $out/prof.txt 2>&1; grep -A30 "cuda profile" $out/prof.txt | head -30
ts done
