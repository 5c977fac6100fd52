# Session 34, call 8: at one token o_proj writes x * norm_w four times (kFoldXgCopies) and gate_up's
# block b copies copy b % 4 (360 blocks had asked L2 for the same 11.5 KB); against gptoss_s2.
# Pack: EXTRA_BINS="/tmp/gptoss_s2" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t fold 200 $K --gtest_filter='*RouterFoldedIntoOproj'
t model 300 $bin/test_cuda_model
ts tests
for rep in 1 2; do
  for w in new s2; do
    [ $w = new ] && x=$g || x=$bin/gptoss_s2
    RUNS=3 b "$w" $x 120b 128 1 --dense-dtype fp8
    RUNS=3 b "$w" $x 20b 128 1 --dense-dtype fp8
    RUNS=3 b "$w" $x 120b 128 1
    RUNS=3 b "$w" $x 120b 128 1 --mxfp4-layers all
  done
done
ts done
# (Result: the same within the runs' spread: 120b fp8 572.8 / 574.3 against 575.2 / 573.5, 20b +0.1%, bf16 / MXFP4 the same; reverted.)
