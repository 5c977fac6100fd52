# Session 34, call 3: the warp top-k by shuffle-merge (route_sort.cuh, k <= 4) and the one-token
# fold's sums loaded before gate_up's row copy, against the session's base (gptoss_base: HEAD
# aa24fb1's kernels). Tests (the top-k forms equal, the routers and the fold against the CPU,
# memcheck of the fold), tg128 at one token and tg32 at 32 sequences alternating.
# Pack: EXTRA_BINS="/tmp/gptoss_base" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t topk 200 $K --gtest_filter='*WarpTopK*:*Route*:*RouterFolded*'
ts topk
timeout 300 compute-sanitizer --tool memcheck $K --gtest_filter='*RouterFoldedIntoOproj:*WarpTopK*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -4 >> $S
t model 300 $bin/test_cuda_model
ts tests
for rep in 1 2; do
  for w in new base; do
    [ $w = new ] && x=$g || x=$bin/gptoss_base
    RUNS=3 b "$w" $x 120b 128 1 --dense-dtype fp8
    RUNS=3 b "$w" $x 20b 128 1 --dense-dtype fp8
    RUNS=3 b "$w" $x 120b 128 1
    RUNS=3 b "$w" $x 120b 128 1 --mxfp4-layers all
    b "$w" $x 120b 32 32 --dense-dtype fp8
    b "$w" $x 120b 32 8 --dense-dtype fp8
  done
done
ts done
