# Session 45, round 3: the rest of check.sh's tests on main's binaries: the attention half of the
# kernel tests, the warp-specialized GEMM's tests in a process of their own, compute-sanitizer
# memcheck of the kernel tests at small shapes.
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts attention
t attention 200 $K --gtest_filter='Kernels.Attention*:Kernels.Flash*'
t warp_specialized 60 $K --gtest_filter='Kernels.*WarpSpecialized*'
ts memcheck
GPTOSS_TEST_SMALL=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no \
  --gtest_filter='-Kernels.*WarpSpecialized*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; tail -3 $out/memcheck.log >> $S
ts done
