set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
for tk in 1 8; do
  for rep in 1 2; do
    timeout 100 $g bench-kernels --model 120b --tokens $tk --iters 100 > $out/bk_${tk}_$rep.log 2>&1
    echo "== tokens $tk rep $rep" >> $S
    grep -E '^\| (qkv \(rows|o_proj|lm_head).*skinny_mma' $out/bk_${tk}_$rep.log | awk -F'|' '{printf "%s|%s|%s|%s\n", $2, $4, $5, $6}' >> $S
    grep -E '^\| moe combine' $out/bk_${tk}_$rep.log | awk -F'|' '{printf "%s|%s|%s\n", $2, $4, $5}' >> $S
  done
done
for c in auto c1; do
  ts "bench 120b combine $c"
  GPTOSS_COMBINE_KERNEL=$c timeout 100 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,8,32 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
ts "fp8 dense"
timeout 100 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" >> $S
ts done
cat $S
