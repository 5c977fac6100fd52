# Session 26, round 4: Nsight Compute of the default warp-walk expert kernel (gate_up, 120b, 64
# tokens, bench-kernels' fixed routing) in main's binary, with no scale math (gptoss_NO_MATH) and
# with a 5-op decode (gptoss_CHEAP_DECODE): which pipe binds, since s26r3 found the scale math's
# removal 7-9% faster and the decode's 24 fewer integer ops a chunk no faster.
# Build: tools/gpu/diag_binary.sh CHEAP_DECODE src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_CHEAP_DECODE
# Build: tools/gpu/diag_binary.sh NO_MATH src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_SCALE_NO_MATH
# Pack: PACK_TESTS=" " EXTRA_BINS="build/diag/gptoss_CHEAP_DECODE build/diag/gptoss_NO_MATH" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
m="sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"
m="$m,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmalite.avg.pct_of_peak_sustained_active"
m="$m,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active"
m="$m,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__issue_active.avg.pct_of_peak_sustained_active"
m="$m,smsp__inst_executed.sum,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread"
m="$m,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active"
for b in gptoss gptoss_NO_MATH gptoss_CHEAP_DECODE; do
  ts "ncu $b"
  timeout 150 $NCU --clock-control none --kernel-name-base mangled -k regex:skinny_warp_units_kernelILi8ELi1ELi8ELi2E \
    --launch-count 1 --metrics $m --section WarpStateStats \
    $bin/$b bench-kernels --model 120b --tokens 64 --iters 1 > $out/ncu_$b.txt 2>&1
  grep -E "skinny_warp|pipe|issue_active|inst_executed.sum|duration|dram__|registers|Stall|stall|Warp Cycles" $out/ncu_$b.txt | head -40 >> $S
done
ts done
cat $S
