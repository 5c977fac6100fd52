# Session 36, call 3: where the one-token qkv's ~2,800 cycles between its wait and its row's
# staging go (both stagings): the block's warps against warp 0 (skinny mma warps clocks), for each
# dense format and 20b; o_proj's fold the same.
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for mf in "120b --dense-dtype fp8" "120b --mxfp4-layers all" "120b" "20b --dense-dtype fp8"; do
  m=${mf%% *}; f=${mf#$m}
  for mc in 1 0; do
    echo "== clocks $m$f x1 mc=$mc" >> $S
    GPTOSS_NORM_IN_MULTICAST=$mc clocks mma_clocks "norm-in|qkv|o_proj" $m $f
  done
done
ts done
