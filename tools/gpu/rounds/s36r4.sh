# Session 36, call 4: with the norm-in multicast, qkv's staged chunk groups by every thread's
# cp.async instead of thread 0's bulk copies (GPTOSS_NORM_IN_CHUNKS_CP_ASYNC, default 1 here), so
# the bulk-copy engine is free for the row's multicast after the wait. The fold and skinny tests,
# memcheck and racecheck of the fold test (small), the warp and staging clocks, tg128 pairs:
# cp.async / bulk copies / no multicast.
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
# (GPTOSS_NORM_IN_CHUNKS_CP_ASYNC and the cp.async staging it switched were measured no faster
# here and are gone.)
source tools/gpu/rounds/prelude.sh
t skinny_fold 200 $K --gtest_filter='*RouterFolded*:*Skinny*'
sanitize 'Kernels.RouterFoldedIntoOproj' memcheck racecheck synccheck
ts tests
for mf in "120b --dense-dtype fp8" "120b --mxfp4-layers all"; do
  m=${mf%% *}; f=${mf#$m}
  for cp in 1 0; do
    echo "== clocks $m$f x1 cp_async=$cp" >> $S
    GPTOSS_NORM_IN_CHUNKS_CP_ASYNC=$cp clocks mma_clocks "norm-in|qkv" $m $f
  done
done
ts clocks
for mf in "120b --dense-dtype fp8" "120b --mxfp4-layers all" "20b --dense-dtype fp8" "120b"; do
  m=${mf%% *}; f=${mf#$m}
  for pass in 1 2; do
    GPTOSS_NORM_IN_CHUNKS_CP_ASYNC=1 RUNS=1 b "mc cp.async" $g $m 128 1 $f
    GPTOSS_NORM_IN_CHUNKS_CP_ASYNC=0 RUNS=1 b "mc bulk" $g $m 128 1 $f
    GPTOSS_NORM_IN_MULTICAST=0 RUNS=1 b "clusters" $g $m 128 1 $f
  done
done
ts done
