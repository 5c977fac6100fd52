# Session 21, first round: more weight bytes in flight in the unit-walking expert kernel. Its
# 1.4-1.9x over its reads is not its access pattern (s20r7: the same bytes in its pattern read at
# the floor) but its dependent chain: one chunk in flight a row tile, so each of a unit's 5-6
# chunk steps waits a memory round trip with ~48 KB in flight an SM. Three shapes with 12 chunks
# in flight a warp (16 warps an SM, ~96 KB in flight an SM):
#   17 "units ks8 rt2 pf6 16w": a warp's whole K slice of a unit at once (one round trip a unit);
#   18 "units ks8 rt4 pf3 16w": two round trips a unit, half 17's units;
#   19 "units ks8 rt6 pf2 16w": three, a third of 17's units (ptxas: 4 bytes spilled).
# Bit for bit against the block-per-tile kernel (SkinnyUnitsKernelMatchesBlockPerTile runs every
# variant), memcheck at small shapes, bench-kernels' expert rows, then the step against the default.
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
t units_tests 200 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.MoeMxfp4FragmentsDecode*'
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no \
  --gtest_filter='Kernels.SkinnyUnits*' > $out/san.txt 2>&1
echo "memcheck rc=$? $(tail -1 $out/san.txt)" >> $S
for mt in "20b 1" "20b 32" "20b 64" "120b 1" "120b 8" "120b 32" "120b 64"; do
  set -- $mt; ts bench-kernels $1 $2
  timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 50 2>&1 | grep -E "experts (gate_up|down)" |
    grep -E "default|units ks8 rt6 pf1|16w|plain read" >> $S
done
for m in 20b 120b; do
  for v in 0 17 18 19 0; do
    ts step $m variant $v
    GPTOSS_SKINNY_VARIANT=$v timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
ts done
rm -f $out/*.log $out/san.txt
cat $S
