# Session 22, fifth round: the skinny kernels' residual add (kAddF32, o_proj's epilogue) reads every
# old value before it stores any sum (skinny_chunk.cuh tile_add_f32). Tests; then the step, the
# previous binary (gptoss_old: s22r4's, read-add-store one value at a time) against this one, at
# 1-8 tokens (o_proj on the skinny kernel) and at 17-32 with o_proj on cuBLASLt (0) or on the
# skinny kernel (GPTOSS_OPROJ_SKINNY_MAX=32).
# tile_add_f32 and GPTOSS_OPROJ_SKINNY_MAX were not kept (1-token step 1.3% slower; docs/BENCHMARKS.md);
# this round ran on an H100 (the H200 did not start).
source tools/gpu/rounds/prelude.sh
xz -dc .gpu-carry-pack/gptoss_old.xz > $bin/gptoss_old && chmod +x $bin/gptoss_old
t ktests 240 $K --gtest_filter='Kernels.SkinnyDense:Kernels.SkinnyUnits*:Kernels.MoeMxfp4FragmentsDecode:Kernels.StreamK*'
t model 200 $bin/test_cuda_model --gtest_filter='CudaModel.TinyFixtureMatchesCpu:CudaModel.*BatchedDecode*:CudaModel.TwoLayers120bShapesMatchCpu'
for r in 1 2; do
  for m in 20b 120b; do
    for v in old:0 new:0 new:32; do
      b=${v%%:*}; o=${v##*:}; exe=$g; [ $b = old ] && exe=$bin/gptoss_old
      ts step $m $b oproj_skinny_max $o
      GPTOSS_OPROJ_SKINNY_MAX=$o timeout 100 $exe bench --device cuda --random-weights $m --pp '' --tg 32 --batch 1,8,24,32 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
    done
  done
done
ts done
rm -f $out/*.log
cat $S
