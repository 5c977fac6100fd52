# Session 32, call 5: does the early launch of o_proj (attention's launch_dependents right after
# its wait) slow the one-token attention's cluster merge? GPTOSS_ATTN_TRIGGER 0 (now) / 1 (after the
# tile loop) / 2 (at the end): the diagnostic clocks (gptoss_attn_clocks) and the step.
# Pack: EXTRA_BINS="build/diag/gptoss_attn_clocks" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
d=$bin/gptoss_attn_clocks
ts start
for at in 0 1 2; do
  echo "== clocks trigger $at 120b x1 fp8" >> $S
  GPTOSS_ATTN_TRIGGER=$at timeout 100 $d bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1 --runs 1 \
    --dense-dtype fp8 2>&1 | grep -E "^\| random|attention clocks" >> $S
done
for rep in 1 2; do
  for at in 0 1 2; do
    GPTOSS_ATTN_TRIGGER=$at b trig$at $g 120b 128 1 --dense-dtype fp8
    GPTOSS_ATTN_TRIGGER=$at b trig$at $g 120b 128 1
  done
done
for at in 0 1 2; do GPTOSS_ATTN_TRIGGER=$at b trig$at $g 20b 128 1 --dense-dtype fp8; done
for at in 0 2; do GPTOSS_ATTN_TRIGGER=$at b trig$at $g 120b 32 4,32 --dense-dtype fp8; done
ts done
