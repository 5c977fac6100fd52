# Session 46, round 4 (prepared, not run: the session's device minutes were spent): the pair
# kernel with down's unit staged in shared memory by one bulk copy as soon as the routing is known
# (GPTOSS_EXPERT_PAIR=2), beside the pair kernel as s46r3 measured it (1) and the two launches
# (0). Correctness first (the fold tests: variant 2 against the two launches' bits; the model
# tests: a GPTOSS_EXPERT_PAIR=2 backend's one-token prompts; memcheck, synccheck and racecheck of
# the fold test), then tg128 x1 alternating, HEAD-of-session binary (gptoss_old, 0dfa734) among
# them, and the traced one-token step with each.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" EXTRA_BINS="build/libgptoss_kernel_trace.so
#   /tmp/s46/gptoss_old" (gptoss_old: a build of 0dfa734; its rows are skipped where it is not packed)
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t fold 240 $K --gtest_filter='Kernels.RouterFolded*'
t model 150 $bin/test_cuda_model
sanitize 'Kernels.RouterFoldedIntoOproj' memcheck synccheck racecheck
ts "A/B"
for args in "120b --dense-dtype fp8" "120b" "20b --dense-dtype fp8" "120b --mxfp4-layers all"; do
  set -- $args; m=$1; shift
  for i in 1 2; do
    [ -x $bin/gptoss_old ] && left 420 && RUNS=1 b "old" $bin/gptoss_old $m 128 1 "$@"
    for p in 0 1 2; do left 420 && GPTOSS_EXPERT_PAIR=$p RUNS=1 b "pair=$p" $g $m 128 1 "$@"; done
  done
done
export TRACE_GREP="sum of adds|skinny_units|replay to replay"
for p in 2 0; do left 540 && GPTOSS_EXPERT_PAIR=$p trace_bench pair$p 1 --random-weights 120b --dense-dtype fp8; done
ts done
