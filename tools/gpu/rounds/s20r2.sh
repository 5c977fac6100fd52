# Session 20, round 2. (a) stage_rows through cp.async (GPTOSS_STAGE_ASYNC=1, the new default):
# a pass's activation rows (8 x 2880 halves at 20b x64) were copied through registers, one L2
# round trip per 256 16-byte pieces (the loop is not pipelined: ~11 round trips), each time a
# unit walk crosses into a new pass and in the dense decode copies at 1-8 tokens; now every piece
# is in flight at once. Same bytes, same numbers. (b) Fewer, longer units: variants 15 and 16
# walk 6 and 8 row tiles a unit at two blocks an SM (rt4's three): a third fewer / half the units
# (rt8 needs tiles % 8: gate_up only; down falls back to the default). The eighteenth and
# nineteenth sessions found the kernel's time proportional to the units it walks.
# bench-kernels' expert rows at 20b 32/64 and 120b 1/8/32/64 tokens with staging off and on,
# then the step.
source tools/gpu/rounds/prelude.sh
# (Run with the kernel tests first: t units_tests 120 $K --gtest_filter='Kernels.SkinnyUnits*:
# Kernels.MoeRouteTies*:Kernels.SkinnyDense*'; their summary lines did not come back, s20r3 reran them.)
for mt in "20b 32" "20b 64" "120b 1" "120b 8" "120b 32" "120b 64"; do
  set -- $mt
  for sa in 0 1; do
    ts bench-kernels $1 $2 stage_async=$sa
    GPTOSS_STAGE_ASYNC=$sa timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 50 > $out/bk_$1_$2_$sa.md 2>&1
    grep -E "experts (gate_up|down)" $out/bk_$1_$2_$sa.md | grep -E "units|fragments|plain read" >> $S
  done
done
for m in 20b 120b; do
  for cfg in "0 0" "0 1" "15 1" "16 1"; do
    set -- $cfg
    ts step $m variant $1 stage_async $2
    GPTOSS_SKINNY_VARIANT=$1 GPTOSS_STAGE_ASYNC=$2 timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
ts done
rm -f $out/*.log
cat $S
