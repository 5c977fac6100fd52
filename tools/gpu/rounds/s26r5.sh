# Session 26, round 5: main's final binaries (a3a9343: the diagnostic hooks compiled out) on the
# GPU: the model tests, the decode expert kernels' tests, the 120b step at one token.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t model 100 $bin/test_cuda_model
t kernels 100 $K --gtest_filter='Kernels.MoeMxfp4Fragments*:Kernels.Skinny*'
ts step
timeout 60 $g bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 1,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
ts done
cat $S
