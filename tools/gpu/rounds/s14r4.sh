source tools/gpu/rounds/prelude.sh
ts tests
t fold 200 $K --gtest_filter='Kernels.CombineFoldedIntoDownMatchesCombineKernel:Kernels.SkinnyUnitsKernelMatchesBlockPerTile:Kernels.MoeMxfp4FragmentsDecode:Kernels.MoeCombine*'
GPTOSS_TEST_SMALL=1 timeout 120 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.CombineFoldedIntoDownMatchesCombineKernel' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
GPTOSS_TEST_SMALL=1 timeout 120 compute-sanitizer --tool racecheck $K --gtest_filter='Kernels.CombineFoldedIntoDownMatchesCombineKernel' --gtest_color=no > $out/race.log 2>&1
echo "racecheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED|hazard" $out/race.log | head -5 >> $S
t model 300 $bin/test_cuda_model
ts kernels
for m in 120b 20b; do
  timeout 100 $g bench-kernels --model $m --tokens 1 --iters 100 > $out/bk_${m}_1.txt 2>&1
  grep -E "experts gate_up \+ down|folded|moe combine \(\+next rmsnorm\) \| 1x2880 \| default|skinny_mma \(fragments\)" $out/bk_${m}_1.txt | sed "s/^/$m /" >> $S
done
timeout 100 $g bench-kernels --model 120b --tokens 8 --iters 50 > $out/bk_120b_8.txt 2>&1
grep -E "experts gate_up \(mxfp4\).*default|experts down \(mxfp4\).*default" $out/bk_120b_8.txt | sed "s/^/120b 8 /" >> $S
ts tg
for m in 120b 20b; do
  timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 128 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/fold /" >> $S
  GPTOSS_COMBINE_FOLD=0 timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 128 --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/nofold /" >> $S
  timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 128 --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/fold /" >> $S
done
ts done
cat $S
