# Session 48, round 1 (an H200 came in s48r0, which ran s45r1: issue 10's bf16 targets met with the
# lm_head screen; loans then paused, so this and s48r2 wait for a later session):
# 1. Why the 8-64-token warp walk reads DRAM at ~75-80% of peak where the plain read of its own
#    pattern reaches ~92% (twenty-sixth session): bench-kernels' new plain-read modes 9 and 10 read
#    the walk's bytes over the walk's own grid (two blocks an SM, contiguous unit runs), a warp
#    asking for 8 adjacent chunks at once (9) or refilling its ring a slot at a time, as the walk
#    does (10). And the walk itself with its ring refilled 2 or 4 slots at once (diagnostic
#    binaries gptoss_walk_lg2 / _lg4: tools/gpu/diag_binary.sh walk_lgN
#    src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_WALK_LOAD_GROUP=N; their outputs
#    are exact, the loads only move later), in bench-kernels and in the step (tg128 x8/x32/x64);
#    the walk without its activations' shared-memory reads (gptoss_walk_no_act,
#    GPTOSS_DIAG_WALK_NO_ACT: garbage sums, bench-kernels only); Nsight Compute of the walk and of
#    modes 9 / 10 at 64 tokens (DRAM throughput, warp stalls).
# (2 and 3: s48r2.sh.)
# Pack: PACK_TESTS= EXTRA_BINS="build/diag/gptoss_walk_lg2 build/diag/gptoss_walk_lg4 build/diag/gptoss_walk_no_act"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for tk in 32 64; do
  for v in main lg4 lg2 no_act; do
    bin_=$g; [ $v != main ] && bin_=$bin/gptoss_walk_$v
    timeout 90 $bin_ bench-kernels --model 120b --tokens $tk --iters 20 > $out/bk${tk}_$v.txt 2>&1
    echo "== bench-kernels $tk tokens, $v" >> $S
    if [ $v = main ]; then grep -E "gate_up \+ down|plain read|\(mxfp4\).*\(fragments\)" $out/bk${tk}_$v.txt | head -20 >> $S
    else grep -E "gate_up \+ down \+ combine|\(mxfp4\).*\(fragments\)" $out/bk${tk}_$v.txt | head -6 >> $S; fi
  done
done
ts "step A/B"
for x in 32 64 8; do
  for i in 1 2; do
    for v in main lg4 lg2; do
      bin_=$g; [ $v != main ] && bin_=$bin/gptoss_walk_$v
      left 300 && RUNS=1 b "$v" $bin_ 120b 128 $x
    done
  done
done
left 330 && { ts "ncu, 64 tokens"
  timeout 150 ncu --clock-control none --kernel-name-base demangled \
    -k "regex:skinny_warp_units_kernel|stream_experts_walk_grid_kernel" --launch-count 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    -o $out/walk $g bench-kernels --model 120b --tokens 64 --iters 1 > $out/walk_run.txt 2>&1; echo "ncu rc=$?" >> $S
  ncu -i $out/walk.ncu-rep --page details > $out/walk_d.txt 2>&1
  grep -E "skinny_warp_units_kernel|stream_experts_walk_grid|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Stall Long|Stall Short|Warp Cycles Per Issued|L2 Hit" \
    $out/walk_d.txt | head -60 >> $S
  rm -f $out/walk.ncu-rep; xz -6 $out/walk_d.txt; }
ts done
