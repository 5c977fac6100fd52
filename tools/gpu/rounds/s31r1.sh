# Session 31, call 1: the router fold's kernels sized by a template capacity (1, 4 or 8 tokens) and
# the fold back at 1-8 tokens. Kernel tests (the fold at 1-8 tokens, routers), memcheck, the model
# tests; the one-token step with capacity 1 against 4 (GPTOSS_ROUTER_FOLD_CAP1=0: the one-token
# kernels of main before this change); 2-8 tokens with the fold at 8 against 4 (GPTOSS_ROUTER_FOLD_TOKENS=4).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 240 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*:Kernels.RouterRoute*'
grep -cE "^router fold" $out/fold.log >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 240 $bin/test_cuda_model
grep -E "^2-layer" $out/model.log | head -6 >> $S
ts one-token
for rep in 1 2; do
  b cap1 $g 120b 64 1 --dense-dtype fp8; GPTOSS_ROUTER_FOLD_CAP1=0 b cap4 $g 120b 64 1 --dense-dtype fp8
  b cap1 $g 120b 64 1; GPTOSS_ROUTER_FOLD_CAP1=0 b cap4 $g 120b 64 1
  b cap1 $g 20b 64 1 --dense-dtype fp8; GPTOSS_ROUTER_FOLD_CAP1=0 b cap4 $g 20b 64 1 --dense-dtype fp8
done
ts 2-8
for rep in 1 2; do
  b fold8 $g 120b 32 2,3,4,5,6,8 --dense-dtype fp8; GPTOSS_ROUTER_FOLD_TOKENS=4 b fold4 $g 120b 32 2,3,4,5,6,8 --dense-dtype fp8
done
b fold8 $g 20b 32 4,5,6,8 --dense-dtype fp8; GPTOSS_ROUTER_FOLD_TOKENS=4 b fold4 $g 20b 32 4,5,6,8 --dense-dtype fp8
ts tg128
b new $g 120b 128 1; b new $g 120b 128 1 --dense-dtype fp8; b new $g 120b 128 1 --mxfp4-layers all
ts done
cat $S
