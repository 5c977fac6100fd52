# Session 35, call 1 (prepared in session 34): where the staged dense kernels' time goes at one
# token (gptoss_mma_clocks: qkv staging rmsnorm(x + moe), o_proj with the router folded in) and the
# one-token expert kernels' stages after the shuffle-merge top-k (gptoss_units_clocks, "fold route").
# Build both diagnostic binaries first:
#   tools/gpu/diag_binary.sh mma_clocks src/backend/cuda/kernels/linear/skinny_mma.cu GPTOSS_DIAG_MMA_CLOCKS
#   tools/gpu/diag_binary.sh units_clocks src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_UNITS_CLOCKS
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks build/diag/gptoss_units_clocks" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for which in mma units; do
  for mf in "120b --dense-dtype fp8" "120b" "120b --mxfp4-layers all" "20b --dense-dtype fp8"; do
    m=${mf%% *}; f=${mf#$m}
    echo "== $which clocks $m x1 $f" >> $S
    timeout 100 $bin/gptoss_${which}_clocks bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1 --runs 1 $f 2>&1 |
      grep -E "^\| random|clocks" | sed -E 's/mean cycles a block://' >> $S
  done
done
for bt in 4 8; do
  echo "== mma clocks 120b fp8 x$bt" >> $S
  timeout 100 $bin/gptoss_mma_clocks bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 --batch $bt \
    --runs 1 2>&1 | grep -E "^\| random|clocks" | sed -E 's/mean cycles a block://' >> $S
done
ts done
