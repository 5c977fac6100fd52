# Session 33, call 2 (prepared in session 32): where the one-token expert kernels' time goes, stage
# by stage (diagnostic binary gptoss_units_clocks: tools/gpu/diag_binary.sh units_clocks
# src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_UNITS_CLOCKS; clock64 at each stage
# of skinny_units_kernel's blocks, mean cycles printed at exit), with the kernel trace beside it.
# Pack: EXTRA_BINS="build/diag/gptoss_units_clocks build/libgptoss_kernel_trace.so" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
d=$bin/gptoss_units_clocks
for m in 120b 20b; do
  for f in "--dense-dtype fp8" ""; do
    echo "== units clocks $m x1 $f" >> $S
    timeout 100 $d bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1 --runs 1 $f 2>&1 |
      grep -E "^\| random|units clocks" | sed -E 's/mean cycles a block://' >> $S
  done
done
echo "== trace 120b fp8 x1" >> $S
CUDA_INJECTION64_PATH=$bin/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=$out/trace.csv timeout 100 $g bench --device cuda \
  --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 --batch 1 --runs 1 2>&1 | grep -E "^\| random|rror|kernel_trace" >> $S
python3 tools/gpu/kernel_trace_report.py $out/trace.csv > $out/report.txt 2>&1; head -12 $out/report.txt >> $S
gzip -f $out/trace.csv
