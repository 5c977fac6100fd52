source tools/gpu/rounds/prelude.sh
ts rest-of-kernel-tests
t k 300 $K --gtest_filter='Kernels.AttentionDecodeStoredMatchesFused:Kernels.AttentionDecodeFusedMatchesTwoKernels:Kernels.Flash*:DecodeAttentionPlan.*:DenseGemmChoice.*:CublasLt.*'
grep -c "^\[       OK" $out/k.log >> $S
grep -E "^\[       OK.*StoredMatchesFused" $out/k.log >> $S
t eagle 100 $bin/test_cuda_eagle3
ts serve
srv 18100 20b -- 32 64
srv 18101 120b -- 32 64
ts done
cat $S
