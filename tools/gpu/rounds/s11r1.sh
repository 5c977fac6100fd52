set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $S
ts kernels
for m in 20b 120b; do for tk in 32 64; do
  timeout 120 $g bench-kernels --model $m --tokens $tk --iters 50 > $out/bk_${m}_$tk.log 2>&1
  timeout 60 $g bench-kernels --model $m --tokens $tk --iters 50 --attention-only > $out/bka_${m}_$tk.log 2>&1
done; done
ts bench
for m in 20b 120b; do timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S; done
ts done
for f in $out/bk_*.log; do echo "== $f" >> $S; grep -E "default|units|floor|stream|attention|combine|router" $f | grep -v "GEMV forced\|row pairs\|expert GEMM" | cut -c1-160 >> $S; done
for f in $out/bka_*.log; do echo "== $f" >> $S; head -30 $f | cut -c1-160 >> $S; done
cat $S
