# Session 23, round 2: one token's experts in one persistent launch (kernels/moe/moe_one_token.cu):
# its kernel tests and sanitizer, the model tests (the tiny fixture's batch-1 steps take it), its
# bench-kernels row beside the two launches, and the batch-1 step with it off / on.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
# The kernel is not on main: branch s23-moe-one-token (correct, slower; docs/BENCHMARKS.md, twenty-third session).
source tools/gpu/rounds/prelude.sh
t kone 200 $K --gtest_filter='Kernels.MoeOneTokenFused:Kernels.MoeMxfp4FragmentsDecode:Kernels.MoeMxfp4Fragments'
grep -E "path=5" $out/kone.log | head -12 >> $S
GPTOSS_TEST_SMALL=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.MoeOneTokenFused' > $out/san.txt 2>&1
echo "memcheck rc=$? $(tail -1 $out/san.txt)" >> $S
GPTOSS_TEST_SMALL=1 timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.MoeOneTokenFused' > $out/race.txt 2>&1
echo "racecheck rc=$? $(tail -1 $out/race.txt)" >> $S
for m in 120b 20b; do
  ts bench-kernels $m 1
  timeout 100 $g bench-kernels --model $m --tokens 1 --iters 100 2>&1 | grep -E "^\| experts gate_up \+ down|^\| moe combine.*default" >> $S
done
for m in 120b 20b; do
  for v in 0 1 0 1; do
    ts step $m one_token $v
    GPTOSS_MOE_ONE_TOKEN=$v timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
t model 240 $bin/test_cuda_model
ts done
rm -f $out/*.log $out/san.txt $out/race.txt
cat $S
