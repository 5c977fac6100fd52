# Session 49, round 1 (any GPU): is the 8-64-token warp walk's gap to its plain read on the H200
# (~12%, against ~4% on the H100: s48r1) a limit of each SM, and does a deeper ring help?
# bench-kernels' new --sm-limit N times its expert rows on N SMs with the others held idle
# (kernels/misc/sm_blocker.h), so an H100 at 92 SMs asks of each SM what an H200's 4.8 TB/s over
# 132 does. The new walk variants keep their ring in shared memory (cp.async; 8, 12, 14 chunk steps:
# skinny variants 27-29), bit-equal to the register walk (Kernels.SkinnyUnitsKernelMatchesBlockPerTile).
# At 64 and 32 tokens: main at all SMs, at 92 (H100) / 110 (H200), and the walk without its
# activations' shared-memory reads (no_act) at the same limit. On an H200, then s48r2's tables.
# Then s49r2.sh: the step with the ring in shared memory (GPTOSS_WALK_RING).
# (With --sm-limit, bench-kernels times only the expert rows: the first form of this round hung in
# cuBLASLt's rows, whose grids assume every SM.)
# Pack: PACK_TESTS=test_cuda_kernels EXTRA_BINS="build/diag/gptoss_walk_no_act build/libgptoss_kernel_trace.so"
source tools/gpu/rounds/prelude.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t units_variants 150 $K --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile'
if [[ $name == *H200* ]]; then lim=110; else lim=92; fi
for tk in 64 32; do
  left 300 && bk_walk main $g $tk 0
  left 320 && bk_walk main $g $tk $lim
  left 340 && bk_walk no_act $bin/gptoss_walk_no_act $tk $lim
done
ts "sm-limit study done"
if [[ $name == *H200* ]]; then
  export TRACE_GREP="replay to replay|sum of adds"
  left 380 && trace_bench fp8 1 --random-weights 120b --dense-dtype fp8
  left 420 && trace_bench bf16 32 --random-weights 120b
  left 450 && trace_bench bf16 64 --random-weights 120b
fi
ts done
