source tools/gpu/rounds/prelude.sh
t fused 110 $K --gtest_filter=Kernels.AttentionDecodeFusedMatchesTwoKernels
grep -E "OK \]|FAILED \]" $out/fused.log >> $S
cat $S
