set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
timeout 100 $K --gtest_filter='Kernels.MoeMxfp4FragmentsDecode' --gtest_color=no > $out/kd.log 2>&1; echo "kd rc=$?"
for t in 8 32; do for o in 1 0; do ts "bench-kernels tokens $t opt $o"
GPTOSS_SKINNY_OPT=$o timeout 120 $g bench-kernels --model 120b --tokens $t --iters 50 > $out/bk${t}_$o.txt 2>&1; grep -E "experts gate_up \(mxfp4\)|experts down \(mxfp4\)" $out/bk${t}_$o.txt | grep -E "ks=8|rt8 pf1|rt4 pf1|rt2 pf4" | head -12
done; done
for o in 1 0; do ts "tg 120b opt $o"; GPTOSS_SKINNY_OPT=$o timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,8,32 --runs 2 2>&1 | grep -E "^\| random"; done
ts done
