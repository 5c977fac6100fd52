# Session 18, round 5: the unit-walking decode expert kernel with four row tiles and two chunks in
# flight (double-buffered weight registers; bench-kernels variants "units ks8 rt4 pf2 16w" at two
# blocks an SM and "... 24w" at three): bit-for-bit test against the block-per-tile kernel, and
# bench-kernels' expert rows at the decode sizes that serving runs.
# (The two variants were measured on a build of this tree with them added and not kept: main's
# bench-kernels does not have them.)
source tools/gpu/rounds/prelude.sh
t units_test 200 $K --gtest_filter=Kernels.SkinnyUnitsKernelMatchesBlockPerTile
for mt in "20b 32" "20b 64" "120b 1" "120b 8" "120b 32" "120b 64"; do
  set -- $mt; ts bench-kernels $1 $2
  timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 50 2>&1 | grep -E "experts (gate_up|down)" | grep -E "units|fragments|plain read" >> $S
done
ts done
rm -f $out/*.log
cat $S
