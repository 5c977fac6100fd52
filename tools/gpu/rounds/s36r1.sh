# Session 36, call 1: two one-token rows brought in by the bulk-copy engine's multicast over
# clusters of 4, each behind a switch: qkv's norm-in row (GPTOSS_NORM_IN_MULTICAST=1,
# stage_row_norm_in_multicast) and gate_up's fold sums, bias and row (GPTOSS_FOLD_MULTICAST=1,
# FoldMulticast). The fold tests (both multicasts against the plain launches, bit for bit),
# memcheck and racecheck of them, the staging clocks, tg128 pairs of each switch against neither.
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks build/diag/gptoss_units_clocks" \
#   PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
# (GPTOSS_FOLD_MULTICAST and the fold multicast it switched, FoldMulticast in skinny_units.cu with
# the fold sums' stride padded to 16 bytes, were measured slower here and never landed; only the
# norm-in multicast did, as the default.)
source tools/gpu/rounds/prelude.sh
t fold 200 $K --gtest_filter='*RouterFolded*'
sanitize 'Kernels.RouterFoldedIntoOproj' memcheck racecheck
ts tests
for mc in "0 0" "1 0" "0 1" "1 1"; do
  set -- $mc
  echo "== clocks 120b fp8 x1 norm_mc=$1 fold_mc=$2" >> $S
  GPTOSS_NORM_IN_MULTICAST=$1 GPTOSS_FOLD_MULTICAST=$2 clocks mma_clocks "norm-in|qkv" 120b --dense-dtype fp8
  GPTOSS_NORM_IN_MULTICAST=$1 GPTOSS_FOLD_MULTICAST=$2 clocks units_clocks "gate_up|fold route" 120b --dense-dtype fp8
done
ts clocks
for mf in "120b --dense-dtype fp8" "120b --mxfp4-layers all" "20b --dense-dtype fp8" "120b"; do
  m=${mf%% *}; f=${mf#$m}
  for pass in 1 2; do
    for mc in "0 0" "1 0" "0 1" "1 1"; do
      set -- $mc
      GPTOSS_NORM_IN_MULTICAST=$1 GPTOSS_FOLD_MULTICAST=$2 RUNS=1 b "norm_mc=$1 fold_mc=$2" $g $m 128 1 $f
    done
  done
done
ts done
