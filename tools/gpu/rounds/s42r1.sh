# Session 42, round 1: the sampler's new inputs and outputs (192a36e, 76fa29d, d570a5b), compiled
# here and never run on a GPU: logit changes (logit_bias, penalties) added in place, structured-
# output masks, top-logprob lists by a radix select. The kernel against the host rule (rows with
# 0 to 3000 changes, NaNs, masks allowing half the ids or five, top lists of 1-20 with ties at
# -inf), both forward_sample paths (the decode graph's: the batched-decode tests; the chunked
# lm_head's: the verify-rows test), sanitizers over the kernel test; then the engine's host time a
# step on this host with one client in 8 penalized, the rows drawn by the backend (new) or on the
# host (s41r2: 4664 us, 211 plain).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" EXTRA_BINS=build/tests/engine/bench_engine_host tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t sampler 120 $K --gtest_filter='Kernels.SampleRows*'
t model 300 $bin/test_cuda_model --gtest_filter='*BatchedDecode*:*BatchInvariantDecode*:*GraphReplay*'
t spec 200 $bin/test_cuda_spec --gtest_filter='*Verify*'
sanitize 'Kernels.SampleRows*' memcheck racecheck synccheck
ts "the engine's host time a step (fake 12 ms passes, 32 clients; plain; 1 in 8 penalized by the backend; on the host)"
timeout 60 $bin/bench_engine_host 32 12000 128 1 0 >> $S 2>&1
timeout 60 $bin/bench_engine_host 32 12000 128 1 8 0 >> $S 2>&1
timeout 60 $bin/bench_engine_host 32 12000 128 1 8 1 >> $S 2>&1
ts done
