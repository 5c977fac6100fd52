# Session 33, call 2 (prepared in session 32): where the one-token expert kernels' time goes, stage
# by stage (diagnostic binary gptoss_units_clocks: tools/gpu/diag_binary.sh units_clocks
# src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_UNITS_CLOCKS; clock64 at each stage
# of skinny_units_kernel's blocks, mean cycles printed at exit), with the kernel trace beside it.
# Pack: EXTRA_BINS="build/diag/gptoss_units_clocks build/libgptoss_kernel_trace.so" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
d=$bin/gptoss_units_clocks
for mf in "120b --dense-dtype fp8" "120b" "20b --dense-dtype fp8"; do
  m=${mf%% *}; f=${mf#$m}
  {
    echo "== units clocks $m x1 $f" >> $S
    timeout 100 $d bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1 --runs 1 $f 2>&1 |
      grep -E "^\| random|units clocks" | sed -E 's/mean cycles a block://' >> $S
  }
done
echo "== trace 120b fp8 x1" >> $S
CUDA_INJECTION64_PATH=$bin/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=$out/trace.csv timeout 100 $g bench --device cuda \
  --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 --batch 1 --runs 1 2>&1 | grep -E "^\| random|rror|kernel_trace" >> $S
python3 tools/gpu/kernel_trace_report.py $out/trace.csv > $out/report.txt 2>&1; head -12 $out/report.txt >> $S
gzip -f $out/trace.csv
# The dense layers at 17-64 tokens: cuBLASLt over the bf16 weights (from GPTOSS_CUBLAS_MIN_ROWS=17,
# the default) against the skinny kernels over the decode copies (65: never cuBLASLt at decode
# sizes), fp8 copies (half the bytes) and bf16, 120b and 20b.
for m in 120b 20b; do
  for mr in 17 65; do
    GPTOSS_CUBLAS_MIN_ROWS=$mr b "fp8 cublas from $mr" $g $m 32 16,24,32,48,64 --dense-dtype fp8
  done
done
GPTOSS_CUBLAS_MIN_ROWS=65 b "bf16 cublas from 65" $g 120b 32 24,32,64
b "bf16 cublas from 17" $g 120b 32 24,32,64
for mr in 17 65; do
  echo "== trace 120b fp8 x32, cublas from $mr" >> $S
  GPTOSS_CUBLAS_MIN_ROWS=$mr CUDA_INJECTION64_PATH=$bin/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=$out/trace32_$mr.csv \
    timeout 100 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 16 --batch 32 --runs 1 2>&1 |
    grep -E "^\| random|rror" >> $S
  python3 tools/gpu/kernel_trace_report.py $out/trace32_$mr.csv > $out/report32_$mr.txt 2>&1
  head -16 $out/report32_$mr.txt >> $S; gzip -f $out/trace32_$mr.csv
done
ts done
