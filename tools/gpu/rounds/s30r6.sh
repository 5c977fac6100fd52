# Session 30, call 6: is f248132's regression at one token the constant kRouterFoldMaxTokens
# (8, sizing the fold's sums, rows and shared arrays)? gptoss_c4: main with it back at 4 (the fold
# then takes 1-4 tokens); gptoss: main; gptoss_3a9: 3a90ae1. tg64 x1 and tg32 x4, alternating.
# Pack: EXTRA_BINS="/tmp/gptoss_3a9 /tmp/gptoss_c4" PACK_TESTS="" tools/gpu/pack.sh (gptoss built from main)
source tools/gpu/rounds/prelude.sh
RUNS=3
old=$bin/gptoss_3a9; c4=$bin/gptoss_c4
for rep in 1 2; do
  b main $g 120b 64 1 --dense-dtype fp8; b c4 $c4 120b 64 1 --dense-dtype fp8; b 3a9 $old 120b 64 1 --dense-dtype fp8
  b main $g 120b 64 1; b c4 $c4 120b 64 1; b 3a9 $old 120b 64 1
  b main $g 20b 64 1 --dense-dtype fp8; b c4 $c4 20b 64 1 --dense-dtype fp8; b 3a9 $old 20b 64 1 --dense-dtype fp8
done
ts done
cat $S
