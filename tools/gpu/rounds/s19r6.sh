# Session 19, round 6: CudaModel.GraphReplayAfterPageTableGrowth made sharp (s19r5's version let
# the bug through: the count it read was 32 of 33, one sequence off, which the 33-sequence case's
# one allowed flip absorbed; now the count read would be 2). On a binary with the bug (must fail)
# and on the fix (must pass), then the whole test_cuda_model on the fix.
source tools/gpu/rounds/prelude.sh
xz -dc .gpu-carry-pack/test_cuda_model_bug.xz > $bin/test_cuda_model_bug; chmod +x $bin/test_cuda_model_bug
t model_test_with_bug 120 $bin/test_cuda_model_bug --gtest_filter='CudaModel.GraphReplayAfterPageTableGrowth'
grep -cE "rel err" $out/model_test_with_bug.log >> $S
grep -E "seq (5|6|7|30|31|32):" $out/model_test_with_bug.log | head -6 >> $S
t test_cuda_model 150 $bin/test_cuda_model
ts done
rm -f $out/*.log
cat $S
