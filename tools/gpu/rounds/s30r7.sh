# Session 30, call 7: the fix (kRouterFoldMaxTokens back at 4; main also carries the MXFP4 norm-in
# change) checked: kernel tests (fold at 1-4 tokens, routers), memcheck, the model tests; the step at
# 1-8 tokens against 3a90ae1 (gptoss_3a9) and the host-side probe (gptoss_host4: kernels sized for 8,
# the backend's sums, rows and default at 4); the combine fold with MXFP4 qkv (1 against 2).
# Pack: EXTRA_BINS="/tmp/gptoss_3a9" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 240 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*:Kernels.RouterRoute*'
grep -cE "^router fold" $out/fold.log >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 240 $bin/test_cuda_model
grep -E "^2-layer" $out/model.log | head -6 >> $S
old=$bin/gptoss_3a9; h4=$bin/gptoss_host4
ts steps
for rep in 1 2; do
  b fix $g 120b 64 1 --dense-dtype fp8; b 3a9 $old 120b 64 1 --dense-dtype fp8
done
for rep in 1 2; do
  b fix $g 120b 32 2,3,4,5,6,8 --dense-dtype fp8; b 3a9 $old 120b 32 2,3,4,5,6,8 --dense-dtype fp8
done
ts tg128
b fix $g 120b 128 1; b fix $g 120b 128 1 --dense-dtype fp8; b fix $g 120b 128 1 --mxfp4-layers all
b fix $g 20b 128 1; b fix $g 20b 128 1 --dense-dtype fp8; b fix $g 20b 128 1 --mxfp4-layers all
ts mxfp4
for rep in 1 2; do
  GPTOSS_COMBINE_FOLD=1 b cf1 $g 120b 64 1 --mxfp4-layers all; GPTOSS_COMBINE_FOLD=2 b cf2 $g 120b 64 1 --mxfp4-layers all
  GPTOSS_COMBINE_FOLD=1 b cf1 $g 20b 64 1 --mxfp4-layers all; GPTOSS_COMBINE_FOLD=2 b cf2 $g 20b 64 1 --mxfp4-layers all
done
ts done
cat $S
