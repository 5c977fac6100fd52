# Session 32, call 1 (main's binaries, 0b25baf + the kernel tracer): where the graphed step's time
# goes, kernel by kernel, with programmatic launches overlapping as they do untraced (the CUPTI
# kernel tracer, src/tools/kernel_trace), at 1 and 32 tokens; and the dense kernels' staged chunk
# groups (GPTOSS_DENSE_STAGE, o_proj digit x 10 + qkv digit) past the default 32.
# Pack: EXTRA_BINS="build/libgptoss_kernel_trace.so" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
tr=$bin/libgptoss_kernel_trace.so
trace() {  # trace NAME MODEL TG BATCH FLAGS...
  local name=$1 m=$2 tg=$3 batch=$4; shift 4
  echo "== trace $name" >> $S
  CUDA_INJECTION64_PATH=$tr KERNEL_TRACE_OUT=$out/trace_$name.csv timeout 100 $g bench --device cuda --random-weights $m \
    --pp '' --tg $tg --batch $batch --runs 1 "$@" 2>&1 | grep -E "^\| random|rror|kernel_trace" >> $S
  python3 tools/gpu/kernel_trace_report.py $out/trace_$name.csv > $out/report_$name.txt 2>&1
  head -30 $out/report_$name.txt >> $S
  gzip -f $out/trace_$name.csv
}
ts start
b untraced $g 120b 32 1 --dense-dtype fp8
trace 120b_fp8_x1 120b 32 1 --dense-dtype fp8
trace 120b_bf16_x1 120b 32 1
trace 120b_bf16_x32 120b 32 32
trace 20b_fp8_x1 20b 32 1 --dense-dtype fp8
ts stage sweep
for rep in 1 2; do
  for st in 32 33 34; do GPTOSS_DENSE_STAGE=$st b stage$st $g 120b 64 1 --dense-dtype fp8; done
done
for st in 32 34; do
  GPTOSS_DENSE_STAGE=$st b stage$st $g 120b 64 1
  GPTOSS_DENSE_STAGE=$st b stage$st $g 120b 64 1 --mxfp4-layers all
done
ts done
