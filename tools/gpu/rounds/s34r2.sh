# Session 34, call 2: the one-token gate_up's routing stage (s34r1: 4,218 cycles, 2.1 us, after
# o_proj) split into the row copy's issue, the sums' arrival, top-k and the block's meeting
# (gptoss_units_clocks, "fold route" line), and two changes to it measured (GPTOSS_FOLD_VARIANT bits:
# 1 = the bias read before the wait, from the weights; 2 = gate_up's row read after its first
# weight loads instead of copied before the routing).
# Pack: EXTRA_BINS="build/diag/gptoss_units_clocks" PACK_TESTS="test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for v in 0 1 2 3; do
  echo "== units clocks 120b fp8 x1 variant $v" >> $S
  GPTOSS_FOLD_VARIANT=$v timeout 100 $bin/gptoss_units_clocks bench --device cuda --random-weights 120b --dense-dtype fp8 \
    --pp '' --tg 64 --batch 1 --runs 1 2>&1 | grep -E "^\| random|clocks" | sed -E 's/mean cycles a block://' >> $S
done
ts clocks
GPTOSS_FOLD_VARIANT=3 t model_v3 300 $bin/test_cuda_model
ts tests
for rep in 1 2; do
  for v in 0 1 2 3; do GPTOSS_FOLD_VARIANT=$v RUNS=3 b "v$v" $g 120b 128 1 --dense-dtype fp8; done
  for v in 0 3; do GPTOSS_FOLD_VARIANT=$v RUNS=3 b "v$v" $g 20b 128 1 --dense-dtype fp8; done
  for v in 0 3; do GPTOSS_FOLD_VARIANT=$v RUNS=3 b "v$v" $g 120b 128 1; done
done
ts done
