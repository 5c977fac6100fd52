# Session 20, round 5: six row tiles a unit as the default where the units fill the GPU four times
# over (8 tokens and up; GPTOSS_UNITS_RT6=0 turns it off), with stage_rows through cp.async (the
# new default since s20r2-r3). The kernel tests that cover the units kernel and the staging, the
# model and speculation tests (greedy equality, batch invariance, graph replays) on the new
# defaults, then the step with rt6 off and on, two paired runs.
source tools/gpu/rounds/prelude.sh
t units_tests 200 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.SkinnyDense*:Kernels.MoeMxfp4FragmentsDecode*:Kernels.Router*'
t test_cuda_model 200 $bin/test_cuda_model
t test_cuda_spec 120 $bin/test_cuda_spec
for r in 1 2; do
  for m in 20b 120b; do
    for rt6 in 0 1; do
      ts step $m rt6=$rt6 run $r
      GPTOSS_UNITS_RT6=$rt6 timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
    done
  done
done
ts done
rm -f $out/*.log
cat $S
