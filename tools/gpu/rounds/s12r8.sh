source tools/gpu/rounds/prelude.sh
for v in auto v3; do
  GPTOSS_EXPERT_GEMM=$v timeout 120 $bin/test_cuda_model --gtest_filter=CudaModel.TwoLayers120bShapesMatchCpu --gtest_repeat=3 --gtest_color=no > $out/flaky_$v.log 2>&1
  echo "$v rc=$?" >> $S; grep -E "greedy equal|^\[  FAILED|OK \]" $out/flaky_$v.log >> $S
done
cat $S
