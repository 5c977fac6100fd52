# Session 34, call 7: at 2-8 tokens, gate_up's block 0 copies its own sort of the pairs into the
# combine's routing instead of sorting them a second time; against gptoss_s2 (HEAD's kernels).
# Pack: EXTRA_BINS="/tmp/gptoss_s2" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t fold 200 $K --gtest_filter='*RouterFoldedIntoOprojTokens*'
t model 300 $bin/test_cuda_model
ts tests
for rep in 1 2; do
  for w in new s2; do
    [ $w = new ] && x=$g || x=$bin/gptoss_s2
    for bt in 2 4 6 8; do b "$w" $x 120b 32 $bt --dense-dtype fp8; done
    b "$w" $x 20b 32 4 --dense-dtype fp8
  done
done
ts done
# (Result: no change at 2-8 tokens, within 0.3%; reverted.)
