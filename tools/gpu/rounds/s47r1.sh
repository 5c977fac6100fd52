# Session 47, round 1: the pair kernel removed (the fold and model tests after it); one token's
# expert shapes after the router fold, each against the default in the same call: down's
# (GPTOSS_FOLD_DOWN_SHAPE 1: two row tiles with the whole unit in flight, 2: four row tiles x three
# steps, 3: one row tile with its whole K slice in flight; 0 the default, two x two) and gate_up's
# chunk steps in flight (GPTOSS_FOLD_GATE_UP_PF=2). The fold tests run under each shape (their
# printed errors against the CPU must be the default's to the digit: the K-split sums are the same
# whatever the row tiles and depth), then tg128 x1 alternating, then the traced one-token step.
# The two knobs lived only in that round's build (bc5b5df's tree plus their switch in
# launch_skinny_units); they were dropped after it (docs/BENCHMARKS.md, forty-seventh session).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" EXTRA_BINS="build/libgptoss_kernel_trace.so"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t fold 240 $K --gtest_filter='Kernels.RouterFolded*'
grep "rel err" $out/fold.log | md5sum >> $S
for v in 1 2 3; do
  GPTOSS_FOLD_DOWN_SHAPE=$v t fold_d$v 240 $K --gtest_filter='Kernels.RouterFolded*'
  grep "rel err" $out/fold_d$v.log | md5sum >> $S
done
GPTOSS_FOLD_GATE_UP_PF=2 t fold_g2 240 $K --gtest_filter='Kernels.RouterFolded*'
grep "rel err" $out/fold_g2.log | md5sum >> $S
t model 150 $bin/test_cuda_model
ts "A/B"
for args in "120b --dense-dtype fp8" "120b" "20b --dense-dtype fp8" "120b --mxfp4-layers all"; do
  set -- $args; m=$1; shift
  for i in 1 2; do
    for v in 0 1 2 3; do left 420 && GPTOSS_FOLD_DOWN_SHAPE=$v RUNS=1 b "down=$v" $g $m 128 1 "$@"; done
    left 420 && GPTOSS_FOLD_GATE_UP_PF=2 RUNS=1 b "gate_up pf2" $g $m 128 1 "$@"
  done
done
export TRACE_GREP="sum of adds|skinny_units|replay to replay"
for v in 0 1 2 3; do left 540 && GPTOSS_FOLD_DOWN_SHAPE=$v trace_bench down$v 1 --random-weights 120b --dense-dtype fp8; done
left 540 && GPTOSS_FOLD_GATE_UP_PF=2 trace_bench gu2 1 --random-weights 120b --dense-dtype fp8
ts done
