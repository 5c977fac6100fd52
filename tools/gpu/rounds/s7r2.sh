set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
ts tests
timeout 200 $K --gtest_filter='Kernels.MoeMxfp4*:Kernels.SkinnyDense*:Kernels.StreamK*:Kernels.Expert*:Kernels.Router*:Kernels.MoeCombine*' --gtest_color=no > $out/k.log 2>&1; echo "kernels rc=$?"; grep -E "^\[  FAILED|PASSED|Failure" $out/k.log | head
GPTOSS_TEST_SMALL=1 timeout 150 $bin/test_cuda_model --gtest_color=no > $out/m.log 2>&1; echo "model rc=$?"; grep -E "^\[  FAILED|PASSED|rel|err" $out/m.log | head -8
for t in 1 8 32; do for o in 3 0; do ts "bench-kernels tokens $t opt $o"
GPTOSS_SKINNY_OPT=$o timeout 120 $g bench-kernels --model 120b --tokens $t --iters 50 > $out/bk${t}_$o.txt 2>&1; grep -E "skinny_mma|experts gate_up \(mxfp4\)|experts down \(mxfp4\)|plain read" $out/bk${t}_$o.txt | grep -v "streamk\|ks16\|ks4 " | head -30
done; done
for o in 3 0; do ts "tg opt $o"
GPTOSS_SKINNY_OPT=$o timeout 90 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,32 --runs 2 2>&1 | grep -E "^\| random"
GPTOSS_SKINNY_OPT=$o timeout 90 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 1,32 --runs 2 2>&1 | grep -E "^\| random"
done
ts sass
cuobjdump -sass $g | awk '/Function : /{p = ($0 ~ /skinny_mma_kernelILi4ELi1ELi8ELi4ELi1ELb1ELi45E/)} p' > $out/sass_rt4pf1.txt; wc -l $out/sass_rt4pf1.txt
grep -oE "^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+(\.[A-Z0-9_]+)*" $out/sass_rt4pf1.txt | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -25
ts done
