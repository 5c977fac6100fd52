# Session 34, call 5: the one-warp pair sort (moe_sort_warp, <= 32 pairs: the 2-8-token fold's
# expert kernels and the decode router up to 8 tokens) with its 32 shuffles unrolled, against
# gptoss_s2 (the folded o_proj's early residual copy). Tests, then tg32 at 1-8 and 32 sequences.
# Pack: EXTRA_BINS="/tmp/gptoss_s2" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t route 300 $K --gtest_filter='*Route*:*RouterFolded*:*WarpTopK*:*Moe*'
t model 300 $bin/test_cuda_model
ts tests
for rep in 1 2; do
  for w in new s2; do
    [ $w = new ] && x=$g || x=$bin/gptoss_s2
    for bt in 2 4 6 8; do b "$w" $x 120b 32 $bt --dense-dtype fp8; done
    b "$w" $x 20b 32 4 --dense-dtype fp8
    RUNS=3 b "$w" $x 120b 64 1 --dense-dtype fp8
    RUNS=3 b "$w" $x 120b 32 32 --dense-dtype fp8
  done
done
ts done
# (Result: slower at 2-8 tokens by 1.3-1.8%; reverted.)
