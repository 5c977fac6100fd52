# Session 50, round 1, short form (for a call of ~6 minutes, when the device budget left is small):
# s50r1's questions in order of need. The shared-memory-ring walk variants' bit-equality test;
# bench-kernels at 64 tokens (the ring variants' rows beside the register walk); the 32- and
# 64-sequence steps with GPTOSS_WALK_RING=0 / 12 alternating, then 14 and 8 if time is left.
# Pack: as s50r1.
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t units_variants 120 $K --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile'
ts "test done"
bk_walk main $g 64 0
ts "bench-kernels done"
for r in 0 12 0 12 14 8; do
  left 330 && GPTOSS_WALK_RING=$r RUNS=1 b "ring $r" $g 120b 128 32,64
done
ts done
