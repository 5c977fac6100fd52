# Session 23, round 8: the warp-per-tile expert walk reads its scales four chunks at a time (one
# 128-byte request a warp, shuffled to the lanes; three at the 16-token passes' ring of six),
# against the previous binary (.gpu-carry/gptoss_base, one 32-byte request a chunk): the unit
# kernels' tests (bit for bit against the block-per-tile kernel), the MoE tests, memcheck,
# bench-kernels and the step.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh, plus the
# previous gptoss as gptoss_base.
# The change is not on main: branch s23-scale-groups (correct, no faster; docs/BENCHMARKS.md, twenty-third session).
# The pack: EXTRA_BINS=<previous gptoss> PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
gb=$bin/gptoss_base
t kunits 300 $K --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile:Kernels.MoeMxfp4FragmentsDecode:Kernels.MoeMxfp4Fragments'
GPTOSS_TEST_SMALL=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.SkinnyUnitsKernelMatchesBlockPerTile' > $out/san.txt 2>&1
echo "memcheck rc=$? $(tail -1 $out/san.txt)" >> $S
for T in 8 32 64; do
  for b in $gb $g; do
    ts bench-kernels 120b $T $b
    timeout 100 $b bench-kernels --model 120b --tokens $T --iters 100 2>&1 | grep -E "experts (gate_up|down) \(mxfp4\) .*, [0-9]+x[0-9]+ \| skinny_mma \(fragments\)" >> $S
  done
done
for m in 120b 20b; do
  for b in $gb $g $gb $g; do
    ts step $m $b
    timeout 100 $b bench --device cuda --random-weights $m --pp '' --tg 32 --batch 8,32,48,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
t model 240 $bin/test_cuda_model
ts done
rm -f $out/*.log $out/san.txt
cat $S
