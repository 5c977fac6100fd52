# Session 35, call 6: HEAD's binaries (qkv's one-token norm-in row staged by clusters of 4): the
# CUDA kernel tests but attention's, the model tests, the sanitizers over the fold and combine-fold
# tests at the default cluster size, and qkv's staged chunk groups retried with the clusters
# (GPTOSS_DENSE_STAGE 31 / 32 / 33).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
t kernels_but_attention 330 $K --gtest_filter='-*Attention*'
ts kernels
t model 200 $bin/test_cuda_model
ts model
timeout 200 compute-sanitizer --tool memcheck $K --gtest_filter='*RouterFoldedIntoOproj' > $out/memcheck.log 2>&1
grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
timeout 200 compute-sanitizer --tool racecheck $K --gtest_filter='*RouterFoldedIntoOproj' > $out/racecheck.log 2>&1
grep -E "RACECHECK SUMMARY|PASSED|FAILED" $out/racecheck.log | head -3 >> $S
ts sanitizers
for pass in 1 2; do
  for st in 32 31 33; do GPTOSS_DENSE_STAGE=$st b "stage$st" $g 120b 128 1 --dense-dtype fp8; done
done
ts done
