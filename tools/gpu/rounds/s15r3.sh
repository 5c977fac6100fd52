# Session 15, round 3: the decode kernels' weights asked of L2 ahead (GPTOSS_SKINNY_L2_PREFETCH
# 0 / 1 / 2): kernels alone, then the step.
# Binaries of branch s15-l2-prefetch (GPTOSS_SKINNY_L2_PREFETCH is not on main).
source tools/gpu/rounds/prelude.sh
ts kernels
for mt in "120b 1" "120b 8" "120b 32" "120b 64" "20b 1" "20b 32" "20b 64"; do
  set -- $mt
  for pf in 0 1 2; do
    GPTOSS_SKINNY_L2_PREFETCH=$pf timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 50 > $out/bk.txt 2>&1
    grep -E "fragments|skinny_mma (bf16|fp8) \||lm_head.*skinny_mma bf16 \|" $out/bk.txt | sed "s/^/pf$pf $1 $2 /" >> $S
  done
done
ts tg
for pf in 0 1 2 0 1; do
  GPTOSS_SKINNY_L2_PREFETCH=$pf timeout 100 $g bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1,32 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/pf$pf /" >> $S
done
rm -f $out/bk.txt
ts done
