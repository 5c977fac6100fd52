# Session 32, call 8: the cluster merge pushed: each split stores its heads' partial rows into the
# merging block's shared memory before the one cluster barrier (no remote reads, no second
# barrier). Stage clocks (gptoss_attn_clocks), the step against gptoss_r2 (the old attention), the
# attention and model tests, memcheck and racecheck, a kernel trace of the one-token step.
# Pack: EXTRA_BINS="/tmp/gptoss_r2 build/diag/gptoss_attn_clocks build/libgptoss_kernel_trace.so" PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
d=$bin/gptoss_attn_clocks old=$bin/gptoss_r2
ts start
echo "== clocks 120b x1 fp8" >> $S
timeout 100 $d bench --device cuda --random-weights 120b --pp '' --tg 64 --batch 1 --runs 1 --dense-dtype fp8 2>&1 |
  grep -E "^\| random|attention clocks" | sed -E 's/mean cycles a block://' >> $S
for rep in 1 2; do
  for f in "--dense-dtype fp8" "" "--mxfp4-layers all"; do b new $g 120b 128 1 $f; b r2 $old 120b 128 1 $f; done
  b new $g 20b 128 1 --dense-dtype fp8; b r2 $old 20b 128 1 --dense-dtype fp8
done
b new $g 20b 128 1; b new $g 20b 128 1 --mxfp4-layers all
b new $g 120b 32 4,32,64 --dense-dtype fp8; b r2 $old 120b 32 4,32,64 --dense-dtype fp8
b new $g 120b 32 1 --dense-dtype fp8 --tg-prompt 8192; b r2 $old 120b 32 1 --dense-dtype fp8 --tg-prompt 8192
echo "== trace new" >> $S
CUDA_INJECTION64_PATH=$bin/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=$out/trace_new.csv timeout 100 $g bench --device cuda \
  --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 --batch 1 --runs 1 2>&1 | grep -E "^\| random|rror|kernel_trace" >> $S
python3 tools/gpu/kernel_trace_report.py $out/trace_new.csv > $out/report_new.txt 2>&1; head -12 $out/report_new.txt >> $S
gzip -f $out/trace_new.csv
t attn 240 $K --gtest_filter='Kernels.AttentionDecodeFused:Kernels.AttentionDecodeStored*:DecodeAttentionPlan.*'
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool racecheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/racecheck.log 2>&1
echo "racecheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/racecheck.log | head -3 >> $S

ts done
