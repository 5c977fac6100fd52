# Session 33, call 5: the router's tokens spread over its cluster's blocks past NW tokens, and the
# decode attention's cluster plans within three blocks an SM (split-and-merge at 25-33 sequences):
# the router and attention tests, memcheck and racecheck of the router, the step against the
# binary before them (gptoss_base) at 24-64 sequences, a traced step at 32, then serving.
# Pack: EXTRA_BINS="/tmp/gptoss_base build/libgptoss_kernel_trace.so" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
old=$bin/gptoss_base
ts start
t route 200 $K --gtest_filter='Kernels.Router*:Kernels.MoeRoute*'
t attn 240 $K --gtest_filter='Kernels.AttentionDecode*:DecodeAttentionPlan.*'
t model 150 $bin/test_cuda_model
GPTOSS_TEST_SMALL=1 timeout 100 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterRouteFused:Kernels.RouterRoutePaddingTakesNoPair' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
GPTOSS_TEST_SMALL=1 timeout 120 compute-sanitizer --tool racecheck $K --gtest_filter='Kernels.RouterRouteFused' > $out/racecheck.log 2>&1
echo "racecheck rc=$?" >> $S; grep -E "RACECHECK SUMMARY|PASSED|FAILED" $out/racecheck.log | head -3 >> $S
ts benches
for f in "--dense-dtype fp8" ""; do
  b new $g 120b 32 24,28,32,48,64 $f; b base $old 120b 32 24,28,32,48,64 $f
done
echo "== trace new 120b fp8 x32" >> $S
CUDA_INJECTION64_PATH=$bin/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=$out/t32.csv timeout 100 $g bench --device cuda \
  --random-weights 120b --dense-dtype fp8 --pp '' --tg 16 --batch 32 --runs 1 2>&1 | grep -E "^\| random|rror" >> $S
python3 tools/gpu/kernel_trace_report.py $out/t32.csv 2>&1 | head -14 >> $S; rm -f $out/t32.csv
ts serving
serve_cs 120b -- 32 64
ts done
