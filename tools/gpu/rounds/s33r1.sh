# Session 33, call 1 (branch s32-attn-push): the pushed cluster merge with its start barrier
# (a relaxed cluster arrive at the kernel's start, the wait before the stores into the merging
# block's shared memory). racecheck and memcheck of the fused decode attention, the attention
# and model tests, then the step against main's binary (gptoss_main), alternating.
# Pack: EXTRA_BINS="/tmp/gptoss_main" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
old=$bin/gptoss_main
ts start
GPTOSS_TEST_SMALL=1 timeout 200 compute-sanitizer --tool racecheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/racecheck.log 2>&1
echo "racecheck rc=$?" >> $S; grep -E "RACECHECK SUMMARY|PASSED|FAILED" $out/racecheck.log | head -3 >> $S
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t attn 240 $K --gtest_filter='Kernels.AttentionDecodeFused:Kernels.AttentionDecodeStored*:DecodeAttentionPlan.*'
t model 150 $bin/test_cuda_model
for rep in 1 2; do
  for f in "--dense-dtype fp8" "" "--mxfp4-layers all"; do b push $g 120b 128 1 $f; b main $old 120b 128 1 $f; done
  b push $g 20b 128 1 --dense-dtype fp8; b main $old 20b 128 1 --dense-dtype fp8
done
b push $g 120b 32 4,32,64 --dense-dtype fp8; b main $old 120b 32 4,32,64 --dense-dtype fp8
ts done
