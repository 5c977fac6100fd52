# Session 52, round 6 (~3 minutes, any H100 / H200): the final commit's tests that this session's
# changes touch: the decode attention's bit-equality tests (their shared helper is new), the
# router's (its x-first form removed again), test_cuda_model.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t attn 150 $K --gtest_filter='Kernels.AttentionDecodeRowFirstMatchesRingFirst:Kernels.AttentionDecodeStoredMatchesFused:Kernels.RouterRoute*'
t model 100 $bin/test_cuda_model
ts done
