# Session 35, call 2: qkv's one-token norm-in row staged by clusters of 4 / 8 / 16 blocks, each
# reading a slice (stage_row_norm_in_cluster), against each block reading the whole row
# (GPTOSS_NORM_IN_CLUSTER=1): the fold tests at each size, the sanitizers, the stage clocks, tg128.
# Pack: EXTRA_BINS="build/diag/gptoss_mma_clocks" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for cl in 1 4 8 16; do
  GPTOSS_NORM_IN_CLUSTER=$cl t fold_cl$cl 120 $K --gtest_filter='*RouterFolded*'
done
GPTOSS_NORM_IN_CLUSTER=8 timeout 200 compute-sanitizer --tool memcheck $K --gtest_filter='*RouterFoldedIntoOproj' > $out/memcheck.log 2>&1
grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
GPTOSS_NORM_IN_CLUSTER=16 timeout 200 compute-sanitizer --tool racecheck $K --gtest_filter='*RouterFoldedIntoOproj' > $out/racecheck.log 2>&1
grep -E "RACECHECK SUMMARY|PASSED|FAILED" $out/racecheck.log | head -3 >> $S
ts tests
for cl in 1 8 16; do
  echo "== mma clocks 120b fp8 x1 cluster $cl" >> $S
  GPTOSS_NORM_IN_CLUSTER=$cl timeout 100 $bin/gptoss_mma_clocks bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' \
    --tg 64 --batch 1 --runs 1 2>&1 | grep -E "^\| random|qkv" | sed -E 's/mean cycles a block://' >> $S
done
for pass in 1 2; do
  for cl in 1 8 4 16; do GPTOSS_NORM_IN_CLUSTER=$cl b "cl$cl" $g 120b 128 1 --dense-dtype fp8; done
done
for mf in "120b" "120b --mxfp4-layers all" "20b --dense-dtype fp8"; do
  m=${mf%% *}; f=${mf#$m}
  for cl in 1 8 1 8; do GPTOSS_NORM_IN_CLUSTER=$cl b "cl$cl" $g $m 128 1 $f; done
done
ts done
