# Session 31, call 2 (branch s31-cap-diag): why the fold kernels' sizes move the one-token step. At
# one token, o_proj's fold kernel and the experts' K-split kernel each run at capacity 1, 2, 3, 4 or 8
# (GPTOSS_FOLD_CAP_O / GPTOSS_FOLD_CAP_E: the same code at 2-8 but for array sizes and unrolls), the
# other at 4 (main's one-token kernels).
# Pack: tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for flags in "--dense-dtype fp8" ""; do
  for rep in 1 2; do
    for c in 1 2 3 4 8; do GPTOSS_FOLD_CAP_O=$c GPTOSS_FOLD_CAP_E=4 b o$c $g 120b 64 1 $flags; done
    for c in 1 2 3 8; do GPTOSS_FOLD_CAP_O=4 GPTOSS_FOLD_CAP_E=$c b e$c $g 120b 64 1 $flags; done
  done
done
ts done
cat $S
