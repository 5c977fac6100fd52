# Prepared in session 22 for the next GPU session (not run): why o_proj on the skinny kernel costs
# ~2.5x its bench-kernels time in a 17-32-token step (docs/BENCHMARKS.md, twenty-second session).
# The profile mode's per-op times (eager passes, an event after every op) with the dense layers on
# cuBLASLt (GPTOSS_CUBLAS_MIN_ROWS=17, the default) and on the skinny kernels (=33) at 24 and 32
# tokens, then the same steps under Nsight Systems where the machine has it (kernel summary only).
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
    GPTOSS_CUBLAS_MIN_ROWS=$rows timeout 200 nsys profile -o $out/r$rows --stats=false $g bench --device cuda \
      --random-weights 20b --pp '' --tg 16 --batch 32 --runs 1 > /dev/null 2>&1
    nsys stats --report cuda_gpu_kern_sum --format csv $out/r$rows.nsys-rep 2>/dev/null | head -25 >> $S
    rm -f $out/r$rows.*
  done
else
  echo "no nsys on this machine" >> $S
fi
ts done
cat $S
