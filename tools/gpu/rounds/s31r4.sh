# Session 31, call 4 (branch s31-fold-cap): the fold's kernels sized for 4 tokens up to 4, 8 above
# (the fold back at 1-8 tokens), and every skinny kernel's, the decode router's and the bf16 GEMV's
# dynamic shared memory 128-byte aligned. The kernel tests but attention's, memcheck of the skinny
# and router ones (small shapes), the model tests; the step at 1 token (tg128), 2-8 tokens (the fold
# at 8 against 4), 16-64 tokens against gptoss_a16 (s31r3's binary: skinny kernels at 16, router and
# GEMV as main); serving 120b at 32 and 64 streams.
# Pack: EXTRA_BINS="/tmp/gptoss_a16" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
a16=$bin/gptoss_a16
ts tests
t kernels 300 $K --gtest_filter='-Kernels.FlashAttention*:Kernels.Attention*'
GPTOSS_TEST_SMALL=1 timeout 200 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.Skinny*:Kernels.Router*:Kernels.MoeMxfp4FragmentsDecode' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 240 $bin/test_cuda_model
ts tg128
for m in 120b 20b; do b new $g $m 128 1; b new $g $m 128 1 --dense-dtype fp8; b new $g $m 128 1 --mxfp4-layers all; done
ts 2-8
for rep in 1 2; do
  b fold8 $g 120b 32 2,3,4,5,6,8 --dense-dtype fp8; GPTOSS_ROUTER_FOLD_TOKENS=4 b fold4 $g 120b 32 2,3,4,5,6,8 --dense-dtype fp8
  b fold8 $g 20b 32 4,5,6,8 --dense-dtype fp8; GPTOSS_ROUTER_FOLD_TOKENS=4 b fold4 $g 20b 32 4,5,6,8 --dense-dtype fp8
done
ts 16-64
for rep in 1 2; do b new $g 120b 32 16,32,64; b a16 $a16 120b 32 16,32,64; b new $g 20b 32 16,64; b a16 $a16 20b 32 16,64; done
ts serve
serve_cs 120b -- 32 64
ts done
