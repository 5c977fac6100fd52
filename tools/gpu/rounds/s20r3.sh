# Session 20, round 3 (run as one device command; written out here): s20r2's first line lost its
# summary (too many files came back), so the kernel tests again, compute-sanitizer memcheck and
# racecheck over the units kernel and the dense staged kernels at small shapes (cp.async staging),
# and the 20b step with stage_rows through registers (0) and cp.async (1), two paired runs.
source tools/gpu/rounds/prelude.sh
t units_tests 200 $K --gtest_filter='Kernels.SkinnyUnits*:Kernels.MoeRouteTies*:Kernels.SkinnyDense*:Kernels.MoeMxfp4FragmentsDecode*'
export GPTOSS_TEST_SMALL=1
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $K --gtest_color=no \
    --gtest_filter='Kernels.SkinnyUnits*:Kernels.SkinnyDense*' > $out/san_$tool.txt 2>&1
  echo "$tool rc=$? $(tail -2 $out/san_$tool.txt | tr '\n' ' ')" >> $S
done
unset GPTOSS_TEST_SMALL
for r in 1 2; do
  for sa in 0 1; do
    ts step 20b stage_async=$sa run $r
    GPTOSS_STAGE_ASYNC=$sa timeout 100 $g bench --device cuda --random-weights 20b --pp '' --tg 32 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
rm -f $out/*.log
cat $S
