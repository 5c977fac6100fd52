# Session 30, call 4: the one-token regression bisected. gptoss (s30-norm-in-late-weights: main),
# gptoss_3a9 (3a90ae1), gptoss_f24 (main with skinny_units.cu and router_fold.cuh of f248132, i.e.
# without the review commits ba6c7b1 / f218e19). 120b fp8 and bf16, 20b fp8 tg64 x1, alternating;
# then main with the router fold off against 3a9 with it off.
# Pack: EXTRA_BINS="/tmp/gptoss_3a9 /tmp/gptoss_f24" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
RUNS=3
old=$bin/gptoss_3a9; f24=$bin/gptoss_f24
ts start
for rep in 1 2; do
  b main $g 120b 64 1 --dense-dtype fp8; b 3a9 $old 120b 64 1 --dense-dtype fp8; b f24 $f24 120b 64 1 --dense-dtype fp8
  b main $g 20b 64 1 --dense-dtype fp8; b 3a9 $old 20b 64 1 --dense-dtype fp8; b f24 $f24 20b 64 1 --dense-dtype fp8
done
for rep in 1 2; do
  GPTOSS_ROUTER_FOLD=0 b main_rf0 $g 120b 64 1 --dense-dtype fp8; GPTOSS_ROUTER_FOLD=0 b 3a9_rf0 $old 120b 64 1 --dense-dtype fp8
  GPTOSS_COMBINE_FOLD=0 b main_cf0 $g 120b 64 1 --dense-dtype fp8; GPTOSS_COMBINE_FOLD=0 b 3a9_cf0 $old 120b 64 1 --dense-dtype fp8
done
ts done
cat $S
