# Session 36, call 7: the norm-in multicast's two copies (x, the sums) issued by two warps
# instead of both by thread 0 (GPTOSS_NORM_IN_MC_SPLIT=1), against HEAD's one issuing thread:
# tg128 pairs, each format.
# Pack: tools/gpu/pack.sh
# (GPTOSS_NORM_IN_MC_SPLIT and the split it switched measured the same here and are gone.)
source tools/gpu/rounds/prelude.sh
for mf in "120b --dense-dtype fp8" "120b --mxfp4-layers all" "20b --dense-dtype fp8" "120b"; do
  m=${mf%% *}; f=${mf#$m}
  for pass in 1 2; do
    GPTOSS_NORM_IN_MC_SPLIT=1 RUNS=1 b "split" $g $m 128 1 $f
    RUNS=1 b "one thread" $g $m 128 1 $f
  done
done
ts done
