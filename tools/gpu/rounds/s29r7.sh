# Session 29: the fold's kernel tests after the draw rule's fix (no near-tie anywhere in a token's
# top k + 1; s29r6 saw two selected experts of an fp8 draw swap order), three runs of fresh draws.
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
for i in 1 2 3; do
  t fold$i 150 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*'
  grep -cE "^router fold" $out/fold$i.log >> $S
done
ts done
cat $S
