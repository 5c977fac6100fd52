# Session 31, call 5 (branch s31-fold-cap, s31r4's binaries): the kernel tests s31r4's 300 s limit
# cut off (from RouterFoldedIntoOprojTokens on), and serving 120b at 32 streams against gptoss_a16
# (s31r3's binary: the skinny kernels' alignment at 16, decode router and GEMV as main; what it
# changes at 1 token does not touch 32 streams), alternating, twice each.
# Pack: EXTRA_BINS="/tmp/gptoss_a16" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t kernels 200 $K --gtest_filter='Kernels.RouterFoldedIntoOprojTokens:Kernels.RouterRoute*:Kernels.MoeCombineVariants:Kernels.Argmax:Kernels.SampleRowsMatchHostRule'
grep -cE "^router fold" $out/kernels.log >> $S
ts serve
new=$g
for rep in 1 2; do
  g=$new; echo "== new" >> $S; serve_cs 120b -- 32
  g=$bin/gptoss_a16; echo "== a16" >> $S; serve_cs 120b -- 32
done
ts done
