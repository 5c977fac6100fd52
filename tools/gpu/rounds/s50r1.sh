# Session 50, round 1 (any GPU; one call of ~9 minutes): s49r1 and s49r2's first questions in one
# call, for a session whose device starts mostly fail. (1) The shared-memory-ring walk variants
# (skinny 27-29, never yet run) bit-equal to the one-warp reference. (2) bench-kernels at 64 and 32
# tokens, all SMs: the ring variants' rows beside the register walk. (3) The 32- and 64-sequence
# steps (one `bench` process a setting: GPTOSS_WALK_RING is read once) with the default walk's ring
# in registers (0) or in shared memory (12 / 14 / 8 chunk steps), alternating. (4) If time is left,
# s49r1's --sm-limit study at 64 tokens.
# Pack: PACK_TESTS=test_cuda_kernels EXTRA_BINS="build/diag/gptoss_walk_no_act build/libgptoss_kernel_trace.so"
source tools/gpu/rounds/prelude.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t units_variants 150 $K --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile'
left 200 && bk_walk main $g 64 0
left 260 && bk_walk main $g 32 0
ts "bench-kernels done"
for i in 1 2; do
  for r in 0 12 14 8; do
    left 440 && GPTOSS_WALK_RING=$r RUNS=1 b "ring $r" $g 120b 128 32,64
  done
done
ts "step A/B done"
if [[ $name == *H200* ]]; then lim=110; else lim=92; fi
left 470 && bk_walk main $g 64 $lim
left 500 && bk_walk no_act $bin/gptoss_walk_no_act 64 $lim
ts done
