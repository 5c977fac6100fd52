# Ran on binaries of branch s12-ring-kernel (the ring-fed decode kernel, GPTOSS_SKINNY_RING; not on main).
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts tests
t ring 200 $K --gtest_filter=Kernels.SkinnyUnitsKernelMatchesBlockPerTile
GPTOSS_TEST_SMALL=1 timeout 200 compute-sanitizer --tool memcheck $K --gtest_filter=Kernels.SkinnyUnitsKernelMatchesBlockPerTile --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
ts kernels
for mn in "20b 32" "20b 64" "120b 32" "120b 64" "120b 8"; do
  set -- $mn
  timeout 120 $g bench-kernels --model $1 --tokens $2 --iters 50 > $out/bk_$1_$2.txt 2>&1
  grep -E "experts (gate_up|down)|plain read" $out/bk_$1_$2.txt | grep -E "units ks8 rt4 pf1|ring|stream|\(fragments\)" >> $S
done
ts step
for r in -1 0 1 2; do for m in 20b 120b; do
  GPTOSS_SKINNY_RING=$r timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/ring=$r /" >> $S
done; done
ts done
cat $S
