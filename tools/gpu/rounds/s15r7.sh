# Session 15, round 7: the unit-walking decode kernel with 16-token passes (two n-tiles; the
# second's activations from global memory): exactness against the block-per-tile kernel, then
# bench-kernels and the step at 20b's 32-64 tokens.
# Binaries of branch s15-units-two-tiles (before its lane-offset fix).
source tools/gpu/rounds/prelude.sh
ts tests
t units 170 $K --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile'
GPTOSS_TEST_SMALL=1 timeout 100 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -3 >> $S
ts kernels
for mt in "20b 64" "20b 48" "20b 32" "120b 64"; do
  set -- $mt
  timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 50 > $out/bk.txt 2>&1
  grep -E "fragments|units" $out/bk.txt | grep -E "gate_up|down" | sed "s/^/$1 $2 /" >> $S
done
ts tg
for mean in 0 6 0 6; do
  GPTOSS_UNITS_NT2_MEAN=$mean timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 64 --batch 32,48,64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/mean$mean /" >> $S
done
rm -f $out/bk.txt $out/san.log
ts done
