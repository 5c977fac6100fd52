# Session 52, round 3 (~9 minutes, any H100 / H200): the checks of the row-first decode attention
# (s52r2 measured it: the 64-sequence attention 22.18 -> 20.58 us a layer, steps +0.3% on an H100).
# The new test in its lighter form (s52r2's full product ran past its limit, no failure), memcheck
# and racecheck over it at small shapes, test_cuda_model and test_cuda_spec (the forward pass
# chooses the order), then the attention half of test_cuda_kernels while time is left.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t rowfirst 150 $K --gtest_filter='Kernels.AttentionDecodeRowFirstMatchesRingFirst'
ts "row-first test done"
sanitize 'Kernels.AttentionDecodeRowFirstMatchesRingFirst' memcheck racecheck
ts "sanitizers done"
t model 240 $bin/test_cuda_model
ts "model done"
left 420 && t spec 100 $bin/test_cuda_spec
left 430 && t attn_rest 120 $K --gtest_filter='Kernels.AttentionPaged:Kernels.Flash*:Kernels.AttentionDecodeStored*'
ts done
