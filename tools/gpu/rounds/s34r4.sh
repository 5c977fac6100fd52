# Session 34, call 4: a folded o_proj copies its rows of the residual and of moe_in into shared
# memory right after its wait (fold_copy_residual), instead of reading them from L2 after its
# reduction; against gptoss_s1 (2ecdd00: the shuffle-merge top-k). Tests, sanitizers on the fold,
# registers of the fold kernels, tg128 at one token and tg32 at 4 and 8 sequences alternating.
# Pack: EXTRA_BINS="/tmp/gptoss_s1" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t fold 200 $K --gtest_filter='*RouterFolded*:*WarpTopK*'
for tool in memcheck racecheck; do
  timeout 300 compute-sanitizer --tool $tool $K --gtest_filter='*RouterFoldedIntoOproj' > $out/$tool.log 2>&1
  echo "$tool rc=$?" >> $S; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $out/$tool.log | head -4 >> $S
done
t model 300 $bin/test_cuda_model
ts tests
for x in $g $bin/gptoss_s1; do
  echo "== registers $(basename $x)" >> $S
  cuobjdump --dump-resource-usage $x 2>/dev/null | grep -A1 "skinny_mma_kernel" | grep -A1 "Li64ELi3ELi[48]ELb0E" |
    grep -oE "REG:[0-9]+ STACK:[0-9]+ SHARED:[0-9]+ LOCAL:[0-9]+" | sort | uniq -c >> $S
done
for rep in 1 2; do
  for w in new s1; do
    [ $w = new ] && x=$g || x=$bin/gptoss_s1
    RUNS=3 b "$w" $x 120b 128 1 --dense-dtype fp8
    RUNS=3 b "$w" $x 20b 128 1 --dense-dtype fp8
    RUNS=3 b "$w" $x 120b 128 1
    RUNS=3 b "$w" $x 120b 128 1 --mxfp4-layers all
    b "$w" $x 120b 32 4 --dense-dtype fp8
    b "$w" $x 120b 32 8 --dense-dtype fp8
  done
done
ts done
