# Prepared in session 22 for the next GPU session (not run): why o_proj on the skinny kernel costs
# ~2.5x its bench-kernels time in a 17-32-token step (docs/BENCHMARKS.md, twenty-second session).
# The profile mode's per-op times (eager passes, an event after every op) with the dense layers on
# cuBLASLt (GPTOSS_CUBLAS_MIN_ROWS=17, the default) and on the skinny kernels (=33) at 24 and 32
# tokens, then the same steps under Nsight Systems where the machine has it (kernel summary only).
# Also: the batch-1 step under Nsight Systems (kernel time summed against the step).
# Only the gptoss binary is needed: PACK_TESTS=" " bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
for rows in 17 33; do
  for b in 24 32; do
    ts profile 20b cublas_min_rows $rows batch $b
    GPTOSS_CUBLAS_MIN_ROWS=$rows GPTOSS_CUDA_PROFILE=1 timeout 100 $g bench --device cuda --random-weights 20b --pp '' \
      --tg 16 --batch $b --runs 1 2>&1 | grep -E "^\|.*tg|qkv|o_proj|attention|router|route|gate_up|down|combine|lm_head" >> $S
  done
done
if command -v nsys >/dev/null; then
  for rows in 17 33; do
    ts nsys 20b cublas_min_rows $rows batch 32
    GPTOSS_CUBLAS_MIN_ROWS=$rows timeout 200 nsys profile --cuda-graph-trace=node -o $out/r$rows --stats=false $g bench --device cuda \
      --random-weights 20b --pp '' --tg 16 --batch 32 --runs 1 > /dev/null 2>&1
    nsys stats --report cuda_gpu_kern_sum --format csv $out/r$rows.nsys-rep 2>/dev/null | head -25 >> $S
    rm -f $out/r$rows.*
  done
  # The batch-1 step: kernel time summed against the step's wall time (how much of a one-token
  # step is kernel boundaries rather than kernels).
  for m in 120b 20b; do
    ts nsys $m batch 1
    timeout 200 nsys profile --cuda-graph-trace=node -o $out/b1$m --stats=false $g bench --device cuda --random-weights $m --pp '' --tg 64 --runs 1 > $out/b1$m.txt 2>&1
    grep -E "^\|.*tg" $out/b1$m.txt >> $S
    nsys stats --report cuda_gpu_kern_sum --format csv $out/b1$m.nsys-rep 2>/dev/null | head -30 >> $S
    rm -f $out/b1$m.*
  done
else
  echo "no nsys on this machine" >> $S
fi
ts done
cat $S
