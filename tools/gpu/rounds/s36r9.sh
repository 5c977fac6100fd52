# Session 36, call 9: HEAD after review (one_wave on sm_count()): test_cuda_kernels without the
# attention tests (attention's code is unchanged since s35's passing run), test_cuda_model, tg128
# of 120b fp8 and MXFP4 dense.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t kernels 420 $K --gtest_filter='-Kernels.Attention*:Kernels.Flash*'
t model 150 $bin/test_cuda_model
ts tests
RUNS=1 b head $g 120b 128 1 --dense-dtype fp8
RUNS=1 b head $g 120b 128 1 --mxfp4-layers all
ts done
