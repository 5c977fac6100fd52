# Session 32, call 7: the decode attention's merge with its sinks read before the wait and the
# cluster's last barrier relaxed (no wait for the output stores); stage clocks split by split
# (gptoss_attn_clocks), the attention tests, the step against gptoss_r2 (the old attention).
# Pack: EXTRA_BINS="/tmp/gptoss_r2 build/diag/gptoss_attn_clocks" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
d=$bin/gptoss_attn_clocks old=$bin/gptoss_r2
ts start
echo "== clocks 120b x1 fp8" >> $S
timeout 100 $d bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1 --runs 1 --dense-dtype fp8 2>&1 |
  grep -E "^\| random|attention clocks" | sed -E 's/mean cycles a block://' >> $S
for rep in 1 2; do
  for f in "--dense-dtype fp8" ""; do b new $g 120b 128 1 $f; b r2 $old 120b 128 1 $f; done
  b new $g 20b 128 1 --dense-dtype fp8; b r2 $old 20b 128 1 --dense-dtype fp8
done
b new $g 120b 32 4,32 --dense-dtype fp8; b r2 $old 120b 32 4,32 --dense-dtype fp8
t attn 240 $K --gtest_filter='Kernels.AttentionDecodeFused:Kernels.AttentionDecodeStored*:DecodeAttentionPlan.*'
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool racecheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/racecheck.log 2>&1
echo "racecheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/racecheck.log | head -3 >> $S
ts done
