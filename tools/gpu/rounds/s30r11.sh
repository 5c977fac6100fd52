# Session 30, call 11 (main after the review: real_token_count shared, the norm-in staging
# rewritten without its array-size trick; -Xptxas -v identical): the fold, router and combine-fold
# kernel tests, memcheck of the fold tests, the model tests, and the one-token step.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t fold 200 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*:Kernels.RouterRoute*'
grep -E "^combine fold fmt=4" $out/fold.log | head -2 >> $S
GPTOSS_TEST_SMALL=1 timeout 120 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY" $out/memcheck.log | head -1 >> $S
t model 200 $bin/test_cuda_model
b main $g 120b 64 1 --dense-dtype fp8; b main $g 120b 64 1 --mxfp4-layers all
ts done
cat $S
