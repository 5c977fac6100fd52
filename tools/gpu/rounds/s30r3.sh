# Session 30, call 3 (binaries of branch s30-norm-in-late-weights, i.e. main plus the change below,
# and gptoss_3a9: commit 3a90ae1, the binary session 29 measured tg128 on).
# 1. Today's one-token step looked slower than session 29's (120b fp8 tg64 ~514 against ~543 in
#    s29r2, while route_once was 565 against 570): main against 3a90ae1, alternating, same machine.
# 2. With MXFP4 qkv the combine fold's norm-in kernel now loads its norm weights after the sum of
#    squares' barrier (36 bytes of spills -> 0): its kernel tests, then GPTOSS_COMBINE_FOLD=1 (not
#    folded there) against 2 (folded), --mxfp4-layers all.
# Pack: cp /tmp/wt3a9/build/gptoss /tmp/gptoss_3a9; EXTRA_BINS=/tmp/gptoss_3a9 PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
RUNS=3
ts tests
t fold 240 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*'
grep -E "^combine fold" $out/fold.log | head -8 >> $S
old=$bin/gptoss_3a9
ts ab
for rep in 1 2 3; do
  b main $g 120b 64 1 --dense-dtype fp8; b 3a9 $old 120b 64 1 --dense-dtype fp8
done
for rep in 1 2; do
  b main $g 120b 64 1; b 3a9 $old 120b 64 1
  b main $g 20b 64 1 --dense-dtype fp8; b 3a9 $old 20b 64 1 --dense-dtype fp8
  b main $g 120b 32 4 --dense-dtype fp8; b 3a9 $old 120b 32 4 --dense-dtype fp8
done
echo "-- main, combine fold off" >> $S
GPTOSS_COMBINE_FOLD=0 b main_cf0 $g 120b 64 1 --dense-dtype fp8
b main $g 120b 64 1 --dense-dtype fp8
GPTOSS_COMBINE_FOLD=0 b main_cf0 $g 120b 64 1 --dense-dtype fp8
ts mxfp4
for rep in 1 2 3; do
  GPTOSS_COMBINE_FOLD=1 b cf1 $g 120b 64 1 --mxfp4-layers all; GPTOSS_COMBINE_FOLD=2 b cf2 $g 120b 64 1 --mxfp4-layers all
done
for rep in 1 2; do
  GPTOSS_COMBINE_FOLD=1 b cf1 $g 20b 64 1 --mxfp4-layers all; GPTOSS_COMBINE_FOLD=2 b cf2 $g 20b 64 1 --mxfp4-layers all
done
ts done
cat $S
