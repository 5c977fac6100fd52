# Session 36, call 6: HEAD with the norm-in multicast as the default (the cp.async and st.async
# variants gone): the fold and skinny tests, the model tests, the sanitizers over the fold test;
# tg128 pairs against GPTOSS_NORM_IN_MULTICAST=0 for each format; tg32 at 4 / 32 streams.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t skinny_fold 200 $K --gtest_filter='*RouterFolded*:*Skinny*:*MoeMxfp4FragmentsDecode*'
t model 150 $bin/test_cuda_model
sanitize 'Kernels.RouterFoldedIntoOproj' memcheck racecheck synccheck
ts tests
for mf in "120b --dense-dtype fp8" "120b --mxfp4-layers all" "20b --dense-dtype fp8" "120b" "20b"; do
  m=${mf%% *}; f=${mf#$m}
  for pass in 1 2; do
    RUNS=1 b "multicast" $g $m 128 1 $f
    GPTOSS_NORM_IN_MULTICAST=0 RUNS=1 b "clusters" $g $m 128 1 $f
  done
done
RUNS=1 b "multicast" $g 120b 32 4,32 --dense-dtype fp8
ts done
