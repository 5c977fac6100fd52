# Session 46, round 3: the pair kernel with its counters met by one release a block and relaxed
# polling (s46r2's acquire loads in a tight loop invalidated the SM's L1 on every poll, and every
# thread fenced): the fold and model tests, tg128 x1 HEAD's binary / pair off / pair on at 120b
# fp8 and bf16, the traced step.
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t fold 240 $K --gtest_filter='Kernels.RouterFolded*'
t model 150 $bin/test_cuda_model
ts "A/B"
for args in "120b --dense-dtype fp8" "120b" "20b --dense-dtype fp8"; do
  set -- $args; m=$1; shift
  for i in 1 2; do
    left 400 && RUNS=1 b "old" $bin/gptoss_old $m 128 1 "$@"
    left 400 && GPTOSS_EXPERT_PAIR=0 RUNS=1 b "off" $g $m 128 1 "$@"
    left 400 && GPTOSS_EXPERT_PAIR=1 RUNS=1 b "pair" $g $m 128 1 "$@"
  done
done
export TRACE_GREP="sum of adds|skinny_units|replay to replay"
left 500 && GPTOSS_EXPERT_PAIR=1 trace_bench pair 1 --random-weights 120b --dense-dtype fp8
ts done
