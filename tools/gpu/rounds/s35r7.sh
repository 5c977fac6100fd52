# Session 35, call 7: HEAD's attention kernel tests (s35r6 ran the others), and the one-token
# step traced kernel by kernel (120b fp8) with the norm-in clusters, for the step table.
# Pack: EXTRA_BINS="build/libgptoss_kernel_trace.so" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
export TRACE_GREP="replay to replay|sum of adds|qkv|skinny|units|attention|lm_head"
trace_bench fp8 1 --random-weights 120b --dense-dtype fp8
cp $out/r_fp8_1.txt $out/trace_report_120b_fp8_x1.txt
ts trace
t attention 420 $K --gtest_filter='*Attention*'
ts done
