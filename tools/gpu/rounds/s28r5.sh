# Session 28, round 5: does the router fold make the 2-layer 120b model's greedy decode diverge
# from the CPU's after a 150-token prompt (rounds 3 and 4: 2/16, 5/16; main: 16/16)? The model
# test twice each with the fold off (0), o_proj's sums only (2) and on (1); the fold's kernel test.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
t fold 100 $K --gtest_filter='Kernels.RouterFoldedIntoOproj'
grep -E "router fold" $out/fold.log >> $S
for rep in 1 2; do
  for fold in 0 2 1; do
    echo "== fold=$fold" >> $S
    GPTOSS_ROUTER_FOLD=$fold timeout 100 $bin/test_cuda_model --gtest_filter='CudaModel.TwoLayers120bShapesMatchCpu' > $out/m$fold$rep.log 2>&1
    grep -E "^2-layer|OK|FAILED  \]" $out/m$fold$rep.log | head -6 >> $S
  done
done
ts done
cat $S
