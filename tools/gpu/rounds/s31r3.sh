# Session 31, call 3 (branch s31-cap-diag): is it the dynamic shared memory's alignment? The expert
# K-split kernel's one-token times in s31r2 followed its static size mod 128 (4176 and 4944, 80:
# slow; 4336, 112: between; 4448, 96 and 4544, 64: fast). gptoss_a16: as s31r2; gptoss (a128): the
# skinny kernels' dynamic shared memory aligned to 128 bytes (__align__(128)). Caps at one token as
# in s31r2; 5-8 tokens with the fold at 8.
# Pack: EXTRA_BINS="/tmp/gptoss_a16" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
a16=$bin/gptoss_a16
for flags in "--dense-dtype fp8" ""; do
  for rep in 1 2; do
    for c in 1 2 3 4 8; do
      GPTOSS_FOLD_CAP_O=4 GPTOSS_FOLD_CAP_E=$c b a16-e$c $a16 120b 64 1 $flags
      GPTOSS_FOLD_CAP_O=4 GPTOSS_FOLD_CAP_E=$c b a128-e$c $g 120b 64 1 $flags
    done
    GPTOSS_FOLD_CAP_O=8 GPTOSS_FOLD_CAP_E=4 b a16-o8 $a16 120b 64 1 $flags
    GPTOSS_FOLD_CAP_O=8 GPTOSS_FOLD_CAP_E=4 b a128-o8 $g 120b 64 1 $flags
  done
done
ts 20b
for rep in 1 2; do
  for c in 1 4 8; do
    GPTOSS_FOLD_CAP_E=$c GPTOSS_FOLD_CAP_O=4 b a16-e$c $a16 20b 64 1 --dense-dtype fp8
    GPTOSS_FOLD_CAP_E=$c GPTOSS_FOLD_CAP_O=4 b a128-e$c $g 20b 64 1 --dense-dtype fp8
  done
done
ts 2-8
for rep in 1 2; do
  b a16 $a16 120b 32 2,4,5,8,16,32 --dense-dtype fp8; b a128 $g 120b 32 2,4,5,8,16,32 --dense-dtype fp8
done
b a16 $a16 20b 32 4,5,8,32 --dense-dtype fp8; b a128 $g 20b 32 4,5,8,32 --dense-dtype fp8
ts done
