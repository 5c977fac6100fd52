# Session 27, round 3: the rest of check.sh on main's binaries (the attention half of the kernel
# tests; compute-sanitizer memcheck of the kernel tests at small shapes) and the 120b step after a
# 32k-token prompt (issue 10's long-context figure, last taken in the third session).
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts attention
t attention 200 $K --gtest_filter='Kernels.Attention*:Kernels.Flash*'
ts memcheck
GPTOSS_TEST_SMALL=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no \
  > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; tail -3 $out/memcheck.log >> $S
ts long
timeout 80 $g bench --device cuda --random-weights 120b --pp '' --tg 32 --tg-prompt 32768 --runs 1 2>&1 | grep -E "^\| random" >> $S
ts done
cat $S
