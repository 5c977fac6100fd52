# Session 32, call 3: the decode attention kernel's q/k/v read in one round trip and its whole
# ring filled before the wait, against gptoss_r2 (s32r2's binary: pipelined steps, the old
# attention); attention tests; the cluster cap (GPTOSS_DECODE_CLUSTER_MAX) at one token; a trace.
# Pack: EXTRA_BINS="/tmp/gptoss_r2 build/libgptoss_kernel_trace.so" PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
old=$bin/gptoss_r2
ts start
t attn 150 $K --gtest_filter='Kernels.AttentionDecode*:DecodeAttentionPlan.*'
GPTOSS_TEST_SMALL=1 timeout 60 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.AttentionDecodeFused' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 200 $bin/test_cuda_model
ts benches
for rep in 1 2; do
  for f in "--dense-dtype fp8" ""; do b new $g 120b 128 1 $f; b r2 $old 120b 128 1 $f; done
  b new $g 20b 128 1 --dense-dtype fp8; b r2 $old 20b 128 1 --dense-dtype fp8
done
b new $g 120b 128 1 --mxfp4-layers all; b r2 $old 120b 128 1 --mxfp4-layers all
b new $g 120b 32 4,32 --dense-dtype fp8; b r2 $old 120b 32 4,32 --dense-dtype fp8
for c in 1 2 4; do GPTOSS_DECODE_CLUSTER_MAX=$c b cmax$c $g 120b 128 1 --dense-dtype fp8; done
echo "== trace new" >> $S
CUDA_INJECTION64_PATH=$bin/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=$out/trace_new.csv timeout 100 $g bench --device cuda \
  --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 --batch 1 --runs 1 2>&1 | grep -E "^\| random|rror|kernel_trace" >> $S
python3 tools/gpu/kernel_trace_report.py $out/trace_new.csv > $out/report_new.txt 2>&1; head -14 $out/report_new.txt >> $S
gzip -f $out/trace_new.csv
ts done
