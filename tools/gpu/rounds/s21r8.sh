# Session 21, eighth round (inline, s21r6's binaries): compute-sanitizer over the units test at
# small shapes, every variant (the 16-token warp walks included). racecheck did not finish in 60 s.
source tools/gpu/rounds/prelude.sh
GPTOSS_TEST_SMALL=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.SkinnyUnits*' > $out/san.txt 2>&1
echo "memcheck rc=$? $(tail -1 $out/san.txt) $(grep -c OK $out/san.txt)" >> $S
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $K --gtest_color=no --gtest_filter='Kernels.SkinnyUnits*' > $out/race.txt 2>&1
echo "racecheck rc=$? $(tail -1 $out/race.txt)" >> $S
rm -f $out/san.txt $out/race.txt
cat $S
