# Session 39, round 1 (prepared in the thirty-eighth session, not yet run): what 2044e49 (one-split
# decode attention on the kernel without the cluster merge) was not checked with on the GPU:
# test_cuda_model, the fused-against-two-kernels attention test, then serving 120b at 32 and 64
# streams and 20b at 64 (the last serving rows, s38r3, predate it). The same run checks the split of
# cuda_backend.cpp into cuda_backend_impl.h / cuda_backend.cpp / cuda_weights.cpp and of
# gemv_gemm.cu into linear.cu / gemv.cu / gemm_mma.cu (code moved, no change meant; the kernels'
# PTX identical; compiled and linked here only): the linear and MoE kernel tests too.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t model 300 $bin/test_cuda_model
t attn 200 $K --gtest_filter='*AttentionDecodeFusedMatchesTwoKernels:*AttentionDecodeStoredMatchesFused'
t linear 200 $K --gtest_filter='Kernels.Linear*:Kernels.MoeMxfp4:Kernels.MoeMxfp4Fragments*'
ts serve
srv 18100 120b -- 32 64
srv 18101 20b -- 64
ts done
