# Session 29, main with the router fold at 1-8 tokens (f248132): the kernel tests around it (the
# skinny and unit kernels' tests, whose non-fold instantiations the change left alone, the decode
# routers and combine), then serving at 4 and 8 streams on 120b (fp8 dense layers) with the fold
# up to one token (GPTOSS_ROUTER_FOLD_TOKENS=1, the session's start) and up to 8 (the default).
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t kern 150 $K --gtest_filter='Kernels.Skinny*:Kernels.RouterRoute*:Kernels.MoeCombine*:Kernels.RouterFolded*'
grep -cE "^\[       OK" $out/kern.log >> $S
for ft in 1 8; do
  ts "serve 120b fp8 fold_tokens=$ft"
  GPTOSS_ROUTER_FOLD_TOKENS=$ft serve_cs 120b --dense-dtype fp8 -- 4 8
done
ts done
cat $S
