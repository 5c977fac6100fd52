# Session 36, call 5: qkv's cluster staging with its slices pushed by st.async onto each block's
# transaction barrier instead of stores and a cluster barrier (GPTOSS_NORM_IN_PUSH=1 with
# GPTOSS_NORM_IN_MULTICAST=0), against the multicast (default) and the stored clusters. The fold
# and skinny tests (push against stores, bit for bit), the sanitizers over the fold test, the
# clocks, tg128 triples.
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
# (GPTOSS_NORM_IN_PUSH and the st.async push it switched were measured no faster here and are
# gone.)
source tools/gpu/rounds/prelude.sh
t skinny_fold 200 $K --gtest_filter='*RouterFolded*:*Skinny*'
sanitize 'Kernels.RouterFoldedIntoOproj' memcheck racecheck synccheck
ts tests
for v in "1 0" "0 1" "0 0"; do
  set -- $v
  echo "== clocks 120b fp8 x1 mc=$1 push=$2" >> $S
  GPTOSS_NORM_IN_MULTICAST=$1 GPTOSS_NORM_IN_PUSH=$2 clocks mma_clocks "norm-in|qkv" 120b --dense-dtype fp8
done
ts clocks
for mf in "120b --dense-dtype fp8" "120b --mxfp4-layers all" "20b --dense-dtype fp8" "120b"; do
  m=${mf%% *}; f=${mf#$m}
  for pass in 1 2; do
    RUNS=1 b "mc" $g $m 128 1 $f
    GPTOSS_NORM_IN_MULTICAST=0 GPTOSS_NORM_IN_PUSH=1 RUNS=1 b "push" $g $m 128 1 $f
    GPTOSS_NORM_IN_MULTICAST=0 RUNS=1 b "stores" $g $m 128 1 $f
  done
done
ts done
