# Session 35, call 3: where the one-token qkv's norm-in staging waits (gptoss_mma_clocks with the
# staging's own stages): each block reading the row against clusters of 4, with qkv's staged chunk
# groups 1 / 2 / 3 (GPTOSS_DENSE_STAGE 31 / 32 / 33) and its first register chunks loaded before
# or after the wait (GPTOSS_DIAG_LATE_W).
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks" PACK_TESTS="" tools/gpu/pack.sh
# (GPTOSS_DIAG_LATE_W was a knob of that call's diagnostic build only, removed after it: held late,
# the loads made the staging slower, 3,751 -> 5,790 cycles for the row's loads.)
source tools/gpu/rounds/prelude.sh
for cl in 1 4; do
  for st in 32 31 33; do
    for late in 0 1; do
      echo "== mma clocks 120b fp8 x1 cluster $cl stage $st late $late" >> $S
      GPTOSS_NORM_IN_CLUSTER=$cl GPTOSS_DENSE_STAGE=$st GPTOSS_DIAG_LATE_W=$late timeout 100 $bin/gptoss_mma_clocks bench \
        --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 64 --batch 1 --runs 1 2>&1 |
        grep -E "^\| random|qkv|norm-in" | sed -E 's/mean cycles a block://' | awk '!seen[$0]++' >> $S
    done
  done
done
ts done
