# Session 21, third round: the warp-per-tile walk as the default (GPTOSS_WARP_UNITS=2: where its
# units fill the GPU's blocks twice over; 0 turns it off). The tests that cover it (the units
# test bit for bit, the MoE decode tests against the CPU, the model and speculative tests with
# their batch-invariant and greedy-equality cases), then the step at 1-64 tokens and serving at
# 32 and 64 streams, off / on, both models.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
t units_tests 200 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.MoeMxfp4*'
t model 300 $bin/test_cuda_model
t spec 120 $bin/test_cuda_spec
for m in 20b 120b; do
  for w in 0 2; do
    ts step $m warp_units $w
    GPTOSS_WARP_UNITS=$w timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 1,2,4,8,16,32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
for m in 20b 120b; do
  for w in 0 2; do
    ts serve $m warp_units $w
    GPTOSS_WARP_UNITS=$w serve_cs $m -- 32 64
  done
done
ts done
rm -f $out/*.log
cat $S
