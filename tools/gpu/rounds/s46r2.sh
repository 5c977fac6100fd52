# Session 46, round 2: one token's gate_up and down in one launch (the pair kernel,
# skinny_units.cu; GPTOSS_EXPERT_PAIR). Its correctness first: the fold tests (the pair kernel's
# outputs against the two launches' bits and the CPU), the model tests (the backend takes it by
# default), memcheck and synccheck; then tg128 at one sequence, HEAD's binary (gptoss_old) against
# the new one with the pair off and on, alternating; and the traced one-token step.
# Pack: EXTRA_BINS="... /tmp/s46/gptoss_old" (HEAD's gptoss, 0dfa734's code)
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts tests
t fold 240 $K --gtest_filter='Kernels.RouterFolded*'
grep -E "router fold|combine fold" $out/fold.log | head -6 >> $S
t model 150 $bin/test_cuda_model
sanitize 'Kernels.RouterFoldedIntoOproj' memcheck synccheck
ts "A/B"
for args in "120b --dense-dtype fp8" "120b" "20b --dense-dtype fp8" "120b --mxfp4-layers all"; do
  set -- $args; m=$1; shift
  for i in 1 2; do
    left 500 && RUNS=1 b "old" $bin/gptoss_old $m 128 1 "$@"
    left 500 && GPTOSS_EXPERT_PAIR=0 RUNS=1 b "off" $g $m 128 1 "$@"
    left 500 && RUNS=1 b "pair" $g $m 128 1 "$@"
  done
done
ts trace
export TRACE_GREP="sum of adds|skinny_units|replay to replay"
left 540 && trace_bench pair 1 --random-weights 120b --dense-dtype fp8
left 560 && GPTOSS_EXPERT_PAIR=0 trace_bench off 1 --random-weights 120b --dense-dtype fp8
ts done
