# Session 35, call 8: HEAD after review (the staged rows' 4-value store shared by the norm-in
# stagings and gate_up's fold row, store_staged4 in skinny_chunk.cuh; the same bits): the
# skinny, fold and expert-decode kernel tests, the model tests, one tg128 of each format.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t skinny_fold 200 $K --gtest_filter='*RouterFolded*:*Skinny*:*MoeMxfp4FragmentsDecode*'
t model 120 $bin/test_cuda_model
ts tests
RUNS=1 b head $g 120b 128 1 --dense-dtype fp8
RUNS=1 b head $g 20b 128 1 --dense-dtype fp8
ts done
