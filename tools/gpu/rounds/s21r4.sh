# Session 21, fourth round: every cuda test on the final code (tools/gpu/check.sh, tests only), the
# first full run since s20r1: the warp-per-tile walk as the default, the review's dynamic
# shared-memory helper (ee8f0e6), the tiny-fixture test's per-row criterion for its random prompt.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts check.sh
bash tools/gpu/check.sh --prebuilt $bin --no-bench --no-sanitizer 2>&1 | tail -14 >> $S
ts done
rm -f $out/*.log
cat $S
