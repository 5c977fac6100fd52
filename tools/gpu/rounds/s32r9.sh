# Session 32, call 9 (s32r8's binaries: the pushed cluster merge, now on branch s32-attn-push): the
# model tests (pipelined greedy among them) and racecheck of the fused decode attention; clusters
# of up to 16 at one token (GPTOSS_DECODE_ATTENTION=auto16) against 8.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts start
t model 150 $bin/test_cuda_model
for rep in 1 2; do
  b c8 $g 120b 128 1 --dense-dtype fp8
  GPTOSS_DECODE_ATTENTION=auto16 b c16 $g 120b 128 1 --dense-dtype fp8
done
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool racecheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/racecheck.log 2>&1
echo "racecheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED|hazard" $out/racecheck.log | head -5 >> $S
ts done
