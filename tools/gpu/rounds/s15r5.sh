# Session 15, round 5: mode 3 without lm_head, in the step.
# Binaries of branch s15-l2-prefetch (GPTOSS_SKINNY_L2_PREFETCH is not on main).
source tools/gpu/rounds/prelude.sh
for m in 120b 20b; do
  for pf in 0 3 0 3; do
    GPTOSS_SKINNY_L2_PREFETCH=$pf timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,8 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/pf$pf /" >> $S
  done
  GPTOSS_SKINNY_L2_PREFETCH=3 timeout 100 $g bench --device cuda --random-weights $m --dense-dtype fp8 --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/fp8 pf3 /" >> $S
  timeout 100 $g bench --device cuda --random-weights $m --dense-dtype fp8 --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/fp8 pf0 /" >> $S
done
ts done
