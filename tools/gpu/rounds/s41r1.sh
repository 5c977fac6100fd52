# Session 41, round 1: mixed sampling (dca3594: a step whose batch holds rows the backend may not
# draw keeps only those rows' logits for the host; the others are drawn on the device). Tests of
# the CUDA paths that keep rows (the decode graph's: the batched-decode tests; the chunked
# lm_head's: the verify-rows tests), then serving 120b at 32 streams with one request in 8 asking
# for presence_penalty (its rows drawn on the host), kept rows on and off
# (GPTOSS_SAMPLER_KEEPS_NO_LOGITS=1: the old path, every row of such a step on the host), and the
# same traffic without the penalty.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" tools/gpu/pack.sh (binaries of 9914529)
source tools/gpu/rounds/prelude.sh
ts tests
t model 300 $bin/test_cuda_model --gtest_filter='*BatchedDecode*:*BatchInvariantDecode*:*GraphReplay*'
t spec 200 $bin/test_cuda_spec --gtest_filter='*Verify*'
for keep in 0 1; do
  ts "serve 120b, GPTOSS_SAMPLER_KEEPS_NO_LOGITS=$keep"
  GPTOSS_SAMPLER_KEEPS_NO_LOGITS=$keep serve_up 120b
  [ $keep = 0 ] && mixed "plain c32"
  mixed "1 in 8 with presence_penalty, c32" --extra-body '{"presence_penalty": 0.5}' --extra-body-every 8
  mixed "1 in 8 with presence_penalty, c32, again" --extra-body '{"presence_penalty": 0.5}' --extra-body-every 8
  serve_down
done
ts done
